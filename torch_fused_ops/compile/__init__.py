"""torch.compile integration: the Inductor pass that rewrites the chain to the fused ops (``fusion_pass``), how it
reads graph nodes (``nodes``), its settings (``pass_config``), installing and switching it (``install``).
"""
