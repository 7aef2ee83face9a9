"""`pdctl capacity`: engine counts, decode limits and graph buckets for a workload and its
latency targets, from the step-time laws `pdctl analyze journal` fitted on the user's own
journals (laws.py), a workload (workload.py, trace.py), the decode's model (model.py), the
prefill's queue and the PD handoff (prefill.py) and a search over layouts (search.py);
report.py prints it. The approximations are in model.py's and prefill.py's docstrings."""
