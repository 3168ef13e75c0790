"""The example data families (UCF101 layout): ``synthetic`` (built in), ``photos`` (held out), their shared
options, writer and layout (``layout``) and the families by name (``families``)."""
