"""`python -m da3po_jax.config > docs/settings.md` rewrites the settings reference."""

from da3po_jax.config.defaults import reference_markdown

print(reference_markdown(), end="")
