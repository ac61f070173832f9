"""The data half of pretraining: readers, the starter corpus, tokenizer training, packing, loading.

``prepare_data(DataConfig(...), out_dir)`` builds (or reuses) ``tokenizer.json`` and packed
train/val shards with a manifest (``python pretrain/prepare.py`` runs it ahead of a job);
``load_prepared(out_dir, config)`` opens them from the manifest alone;
``PackedLoader(prepared, "train", batch_size, rank, world_size)`` serves them.
"""

from .config import DataConfig, DataError, PreparedData
from .loader import PackedLoader
from .prepare import load_prepared, open_prepared, prepare_data

__all__ = [
    "DataConfig",
    "DataError",
    "PackedLoader",
    "PreparedData",
    "load_prepared",
    "open_prepared",
    "prepare_data",
]
