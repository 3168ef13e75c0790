"""Pictures of frames, clips and flow (flow in the colours of the optical-flow benchmarks), drawn without
matplotlib; used by training (TensorBoard images), evaluation (retrieval strips) and the reports (§2.6)."""
