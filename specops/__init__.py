"""specops: picks, proves and applies the fastest lossless speculative-decoding setup."""
