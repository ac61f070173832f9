"""The data half of pretraining: readers, the starter corpus, tokenizer training, packing, loading.

``prepare_data(DataConfig(...), out_dir)`` builds (or reuses) ``tokenizer.json`` and packed
train/val shards; ``PackedLoader(prepared, "train", batch_size, rank, world_size)`` serves them.
"""

from .config import DataConfig, DataError, PreparedData
from .loader import PackedLoader
from .prepare import load_prepared, prepare_data

__all__ = [
    "DataConfig",
    "DataError",
    "PackedLoader",
    "PreparedData",
    "load_prepared",
    "prepare_data",
]
