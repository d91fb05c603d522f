"""KV caches: `HostKVCache` keeps one sequence's keys and values in host memory (CPU engine)."""

from strata.kv.cache import HostKVCache, KVCacheError

__all__ = ["HostKVCache", "KVCacheError"]
