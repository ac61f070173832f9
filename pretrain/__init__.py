"""pretrain: corpus, tokenizer, packing and lock-step recurrent-depth training."""
