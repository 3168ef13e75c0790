"""Evaluation: retrieval, probes, finetuning, late fusion and Oops on frozen or finetuned models."""
