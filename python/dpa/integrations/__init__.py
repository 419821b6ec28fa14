"""Integrations of dpa with model libraries: ``dpa.integrations.transformers`` (Hugging Face)."""
