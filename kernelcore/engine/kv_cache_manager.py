"""Paged KV block allocation with prefix caching: hashed full blocks, refcounts, LRU eviction.

With a sliding window (every layer of the model attends to its last ``sliding_window`` positions only) the
blocks wholly behind the window of a request's next token are freed as it advances; their entries in the
request's block table become NULL_BLOCK (the attention backends never read them)."""

from __future__ import annotations

import hashlib
import os
from array import array
from collections import OrderedDict
from collections.abc import Sequence

from kernelcore.engine.request import Request

NULL_BLOCK = -1


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def hash_block(parent: bytes, token_ids: list[int], lora_id: int) -> bytes:
    return hashlib.sha256(parent + array("q", token_ids).tobytes() + lora_id.to_bytes(8, "little")).digest()


class KVCacheManager:
    def __init__(self, num_blocks: int, block_size: int, enable_prefix_caching: bool = True,
                 sliding_window: int | None = None) -> None:
        assert num_blocks > 0 and block_size > 0 and (sliding_window is None or sliding_window > 0)
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.sliding_window = sliding_window
        self.num_window_freed = 0  # blocks freed behind the sliding window, in total
        self.enable_prefix_caching = enable_prefix_caching
        self.ref_counts = [0] * num_blocks
        self.block_hash: list[bytes | None] = [None] * num_blocks
        self.cached_blocks: dict[bytes, int] = {}
        self.free_blocks: OrderedDict[int, None] = OrderedDict.fromkeys(range(num_blocks))  # front = evicted first
        self.hash_root = os.urandom(32)  # per-run salt: hashes are not predictable across runs
        self.num_queries = 0  # prompt tokens looked up in the prefix cache
        self.num_hits = 0  # of which found

    @property
    def num_free_blocks(self) -> int:
        return len(self.free_blocks)

    @property
    def usage(self) -> float:
        return 1.0 - len(self.free_blocks) / self.num_blocks

    def hash_blocks(self, request: Request) -> list[bytes]:
        hashes, bs, tokens = request.block_hashes, self.block_size, request.all_token_ids
        for i in range(len(hashes), len(tokens) // bs):
            parent = hashes[i - 1] if i else self.hash_root
            hashes.append(hash_block(parent, tokens[i * bs:(i + 1) * bs], request.lora_id))
        return hashes

    def get_computed_blocks(self, request: Request) -> tuple[list[int], int]:
        """The longest cached prefix of full blocks (at least one token is always left to compute)."""
        if not self.enable_prefix_caching or request.sampling_params.prompt_logprobs is not None:
            return [], 0
        hits = []
        for block_hash in self.hash_blocks(request)[:(request.num_tokens - 1) // self.block_size]:
            block_id = self.cached_blocks.get(block_hash)
            if block_id is None:
                break
            hits.append(block_id)
        return hits, len(hits) * self.block_size

    def record_query(self, num_tokens: int, num_hit_tokens: int) -> None:
        self.num_queries += num_tokens
        self.num_hits += num_hit_tokens

    def can_allocate(self, request: Request, num_new_tokens: int, computed_blocks: Sequence[int] = ()) -> bool:
        num_total = request.num_computed_tokens + len(computed_blocks) * self.block_size + num_new_tokens
        num_new_blocks = cdiv(num_total, self.block_size) - len(request.block_ids) - len(computed_blocks)
        num_revived = sum(1 for b in computed_blocks if self.ref_counts[b] == 0)
        return num_new_blocks + num_revived <= len(self.free_blocks)

    def allocate_slots(self, request: Request, num_new_tokens: int, computed_blocks: Sequence[int] = ()) -> bool:
        """Give ``request`` blocks for ``num_new_tokens`` more tokens (after the cached ``computed_blocks``)."""
        self.free_behind_window(request)
        if not self.can_allocate(request, num_new_tokens, computed_blocks):
            return False
        for block_id in computed_blocks:
            if self.ref_counts[block_id] == 0:
                del self.free_blocks[block_id]
            self.ref_counts[block_id] += 1
        request.block_ids.extend(computed_blocks)
        request.num_cached_blocks = max(request.num_cached_blocks, len(request.block_ids))
        num_total = request.num_computed_tokens + len(computed_blocks) * self.block_size + num_new_tokens
        for _ in range(cdiv(num_total, self.block_size) - len(request.block_ids)):
            block_id, _ = self.free_blocks.popitem(last=False)
            self._evict(block_id)
            self.ref_counts[block_id] = 1
            request.block_ids.append(block_id)
        return True

    def free_behind_window(self, request: Request) -> int:
        """Free the request's blocks that no query from its next token on can see; returns how many."""
        if self.sliding_window is None:
            return 0
        first_visible = max(0, request.num_computed_tokens - self.sliding_window + 1)
        num_behind = min(first_visible // self.block_size, len(request.block_ids))
        freed = 0
        for i in range(request.num_window_freed, num_behind):
            block_id = request.block_ids[i]
            if block_id != NULL_BLOCK:
                self._release(block_id)
                request.block_ids[i] = NULL_BLOCK
                freed += 1
        request.num_window_freed = max(request.num_window_freed, num_behind)
        self.num_window_freed += freed
        return freed

    def _release(self, block_id: int) -> None:
        self.ref_counts[block_id] -= 1
        assert self.ref_counts[block_id] >= 0, f"block {block_id} freed twice"
        if self.ref_counts[block_id] == 0:
            self.free_blocks[block_id] = None
            if self.block_hash[block_id] is None:
                self.free_blocks.move_to_end(block_id, last=False)

    def _evict(self, block_id: int) -> None:
        block_hash = self.block_hash[block_id]
        if block_hash is not None:
            self.block_hash[block_id] = None
            if self.cached_blocks.get(block_hash) == block_id:
                del self.cached_blocks[block_hash]

    def cache_blocks(self, request: Request) -> None:
        """Register the request's newly computed full blocks in the prefix cache."""
        if not self.enable_prefix_caching:
            return
        num_full = request.num_computed_tokens // self.block_size
        if num_full <= request.num_cached_blocks:
            return
        hashes = self.hash_blocks(request)
        for i in range(request.num_cached_blocks, num_full):
            block_id, block_hash = request.block_ids[i], hashes[i]
            if block_id != NULL_BLOCK and self.block_hash[block_id] is None and block_hash not in self.cached_blocks:
                self.block_hash[block_id] = block_hash
                self.cached_blocks[block_hash] = block_id
        request.num_cached_blocks = num_full

    def free(self, request: Request) -> None:
        # Tail blocks first, so a shared prefix is evicted last; uncached blocks are reused before cached ones.
        for block_id in reversed(request.block_ids):
            if block_id != NULL_BLOCK:
                self._release(block_id)
        request.block_ids = []
        request.num_cached_blocks = 0
        request.num_window_freed = 0

    def reset_prefix_cache(self) -> bool:
        if len(self.free_blocks) != self.num_blocks:
            return False
        self.cached_blocks.clear()
        self.block_hash = [None] * self.num_blocks
        return True
