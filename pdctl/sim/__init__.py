"""pdctl.sim — a GPU-free engine that looks like SGLang 0.5.23 from the outside.

Run it with SGLang's command line: `python -m pdctl.sim --model-path M --disaggregation-mode
prefill ...`. It serves SGLang's HTTP API, the PD bootstrap protocol, `sglang:*` metrics and
scheduler log lines, with a decode step-time model from the seed deployment. Sim-only knobs
are PDSIM_* environment variables (pdctl/sim/args.py, docs/sim.md).
"""

__version__ = "0.5.23-pdsim"
