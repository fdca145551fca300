"""ndplan: analytic planning of N-dimensional parallelism for LLM training.

The public surface is what ``__all__`` lists; everything else may change.
"""

__version__ = "0.1.0"

__all__ = ["__version__"]
