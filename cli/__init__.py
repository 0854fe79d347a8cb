"""The command-line layer of te-ckpt-audit (installed as `te_ckpt_audit_cli`): Typer + Rich only."""
