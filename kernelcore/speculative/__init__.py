"""Speculative decoding: proposers (a plugin family) guess a request's next tokens; the engine verifies every
guess in one forward pass and keeps exactly what the target model's sampling would have produced."""
