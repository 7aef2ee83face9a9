"""Journal analytics: decode scaling, step-time law and CUDA-graph buckets from engine logs."""
