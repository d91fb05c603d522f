"""Experts: the host store the GPU reads, the VRAM cache's residency (one owner of the slot
table), hit/miss accounting, and routing profiles. Plain Python/numpy, testable without a GPU."""

from strata.experts.cache import CacheDevice, CacheStateError, ExpertCache, Loan
from strata.experts.profile import ProfileError, RoutingCounts, load_counts, profile_source
from strata.experts.stats import DecodeHits, PrefillTraffic
from strata.experts.store import BlobLayout, HostStore, blob_layout, build_store

__all__ = [
    "BlobLayout", "CacheDevice", "CacheStateError", "DecodeHits", "ExpertCache", "HostStore",
    "Loan", "PrefillTraffic", "ProfileError", "RoutingCounts", "blob_layout", "build_store",
    "load_counts", "profile_source",
]
