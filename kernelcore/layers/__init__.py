"""In-tree layers: tensor-parallel linears and embeddings, custom ops, and the Attention layer."""
