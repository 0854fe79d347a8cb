"""`python -m te_ckpt_audit_cli`: the same as the `te-ckpt-audit` command."""

from ._launch import main

main()
