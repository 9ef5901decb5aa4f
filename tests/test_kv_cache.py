from test_engine_fakes import make_request

from kernelcore.engine.kv_cache_manager import KVCacheManager
from kernelcore.engine.request import Request


def _request(rid, prompt, **params):
    return Request(make_request(rid, prompt, **params), max_model_len=1024)


def test_allocate_free_returns_all_blocks():
    kv = KVCacheManager(num_blocks=8, block_size=4)
    r = _request("a", list(range(10)))
    assert kv.allocate_slots(r, 10)
    assert len(r.block_ids) == 3 and kv.num_free_blocks == 5
    r.num_computed_tokens = 10
    assert kv.allocate_slots(r, 1) and len(r.block_ids) == 3
    r.num_computed_tokens = 12
    assert kv.allocate_slots(r, 1) and len(r.block_ids) == 4
    kv.free(r)
    assert kv.num_free_blocks == 8 and r.block_ids == []


def test_allocation_fails_without_partial_grab():
    kv = KVCacheManager(num_blocks=2, block_size=4)
    r = _request("a", list(range(12)))
    assert not kv.allocate_slots(r, 12)
    assert kv.num_free_blocks == 2 and r.block_ids == []


def test_prefix_hit_shares_blocks_and_counts():
    kv = KVCacheManager(num_blocks=16, block_size=4)
    a = _request("a", list(range(10)))
    assert kv.get_computed_blocks(a) == ([], 0)
    kv.allocate_slots(a, 10)
    a.num_computed_tokens = 10
    kv.cache_blocks(a)
    b = _request("b", list(range(8)) + [99, 98, 97])
    hits, num_hit = kv.get_computed_blocks(b)
    assert hits == a.block_ids[:2] and num_hit == 8
    assert kv.allocate_slots(b, 3, hits)
    assert [kv.ref_counts[x] for x in a.block_ids[:2]] == [2, 2]
    kv.free(a)
    kv.free(b)
    assert kv.num_free_blocks == 16
    # Still cached after free: a third request hits them again (revived from the free list).
    c = _request("c", list(range(9)))
    hits, num_hit = kv.get_computed_blocks(c)
    assert num_hit == 8
    assert kv.allocate_slots(c, 1, hits) and kv.num_free_blocks == 13


def test_full_prompt_hit_leaves_one_token_to_compute():
    kv = KVCacheManager(num_blocks=16, block_size=4)
    a = _request("a", list(range(8)))
    kv.allocate_slots(a, 8)
    a.num_computed_tokens = 8
    kv.cache_blocks(a)
    hits, num_hit = kv.get_computed_blocks(_request("b", list(range(8))))
    assert num_hit == 4 and len(hits) == 1


def test_lru_eviction_prefers_uncached_then_oldest():
    kv = KVCacheManager(num_blocks=4, block_size=2)
    a = _request("a", [1, 2, 3, 4])
    kv.allocate_slots(a, 4)
    a.num_computed_tokens = 4
    kv.cache_blocks(a)
    kv.free(a)
    assert len(kv.cached_blocks) == 2
    b = _request("b", [7, 8, 9, 10])
    kv.allocate_slots(b, 4)  # takes the two never-cached blocks first
    assert len(kv.cached_blocks) == 2
    c = _request("c", [5, 6])
    kv.allocate_slots(c, 2)  # now one cached block must be evicted: a's tail first
    assert len(kv.cached_blocks) == 1
    hits, num_hit = kv.get_computed_blocks(_request("d", [1, 2, 3, 4, 5]))
    assert num_hit == 2


def test_hashes_are_salted_per_run():
    a, b = KVCacheManager(4, 4), KVCacheManager(4, 4)
    ra, rb = _request("a", list(range(8))), _request("b", list(range(8)))
    assert a.hash_blocks(ra) != b.hash_blocks(rb)


def test_prefix_caching_off_never_hits():
    kv = KVCacheManager(num_blocks=16, block_size=4, enable_prefix_caching=False)
    a = _request("a", list(range(10)))
    kv.allocate_slots(a, 10)
    a.num_computed_tokens = 10
    kv.cache_blocks(a)
    assert kv.get_computed_blocks(_request("b", list(range(10)))) == ([], 0)


def test_sliding_window_frees_blocks_wholly_behind_the_window():
    from kernelcore.engine.kv_cache_manager import NULL_BLOCK

    kv = KVCacheManager(num_blocks=8, block_size=4, sliding_window=6)
    r = _request("a", list(range(10)))
    assert kv.allocate_slots(r, 10) and kv.num_free_blocks == 5
    r.num_computed_tokens = 10  # the next token (position 10) sees positions 5..10: block 0 (0-3) is behind
    assert kv.allocate_slots(r, 1)
    assert r.block_ids[0] == NULL_BLOCK and kv.num_window_freed == 1 and kv.num_free_blocks == 6
    for n in range(11, 40):  # decode on: at most ceil(6 / 4) + 1 blocks are ever held
        r.num_computed_tokens = n
        assert kv.allocate_slots(r, 1)
        held = [b for b in r.block_ids if b != NULL_BLOCK]
        assert len(held) <= 3 and len(r.block_ids) == -(-(n + 1) // 4)
    first_visible = 39 - 6 + 1
    assert kv.num_window_freed == first_visible // 4 == r.block_ids.count(NULL_BLOCK)
    kv.free(r)  # the NULL entries are skipped, nothing is freed twice
    assert kv.num_free_blocks == 8


def test_sliding_window_blocks_stay_in_the_prefix_cache_after_freeing():
    kv = KVCacheManager(num_blocks=6, block_size=4, sliding_window=4)
    a = _request("a", list(range(13)))
    assert kv.allocate_slots(a, 13)
    a.num_computed_tokens = 13
    kv.cache_blocks(a)
    first_two = a.block_ids[:2]
    assert kv.allocate_slots(a, 1) and kv.num_window_freed == 2  # blocks 0-1 are behind position 13's window
    assert kv.num_free_blocks == 4
    b = _request("b", list(range(13)))
    hits, num_hit = kv.get_computed_blocks(b)
    assert num_hit == 12 and hits[:2] == first_two  # freed but still cached: a prefix hit revives them
    assert kv.allocate_slots(b, 1, hits) and kv.num_free_blocks == 4 - 2 - 1


def test_without_a_window_nothing_is_freed_early():
    kv = KVCacheManager(num_blocks=8, block_size=4)
    r = _request("a", list(range(30)))
    assert kv.allocate_slots(r, 30)
    r.num_computed_tokens = 30
    assert kv.allocate_slots(r, 1) and kv.num_window_freed == 0 and -1 not in r.block_ids
