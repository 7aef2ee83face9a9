"""pd-exporter: what the engines' own /metrics cannot say — GPU readings through NVML, whether
each PD pair really serves (a canary request), and graph-vs-eager decode batches from the
engines' journals. Served by `pdctl exporter` / `python -m pdctl.exporter`."""
