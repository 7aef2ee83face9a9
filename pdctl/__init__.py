"""pdctl — operate SGLang prefill/decode disaggregated serving on bare-metal GPU hosts."""

__version__ = "0.1.0"
