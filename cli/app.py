"""The `te-ckpt-audit` command: one Typer app. `audit` is the default command, so
`te-ckpt-audit TARGET` runs it; `te-ckpt-audit policies` lists the policy specs."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Any

import typer
from typer.core import TyperCommand, TyperGroup
from typer.exceptions import TyperException

from .audit_cmd import audit
from .check_cmd import check
from .exit_codes import ExitCode
from .gpus_cmd import gpus
from .maxtext_cmd import maxtext
from .options import TopVersion
from .policies_cmd import policies
from .recommend_cmd import recommend
from .terminal import PROG, end_on_sigterm, fail
from .tpus_cmd import tpus

DEFAULT_COMMAND = "audit"


# Options of the command itself, not of audit: `te-ckpt-audit --help` lists them
TOP_OPTIONS = ("--help", "-h", "--version", "-V", "--install-completion", "--show-completion")


def _usage_hint(args: list[str]) -> str:
    """The hint for Click's usage error: a TARGET split at a space (`model.py loss`) is named
    whole, as it was surely meant; anything else points at the help."""
    for here, after in zip(args, args[1:], strict=False):
        if (here.endswith(".py") and ":" not in here and after.isidentifier()
                and not here.startswith("-")):
            return f"did you mean {here}:{after}? a TARGET is one word, FILE.py:FUNCTION"
    return f"see `{PROG} --help`"


class _DefaultCommandGroup(TyperGroup):
    """A group whose first argument names a command only when it is one; anything else (a TARGET,
    an option of audit's) goes to `audit`, and nothing at all shows the help. Click's own errors
    become our one line and exit 2."""

    def parse_args(self, ctx: Any, args: list[str]) -> list[str]:
        if not args and not ctx.resilient_parsing:  # a bare `te-ckpt-audit`: what it can do
            typer.echo(ctx.get_help())
            ctx.exit(0)
        if args and args[0] not in TOP_OPTIONS and args[0] not in self.commands:
            args = [DEFAULT_COMMAND, *args]
        return super().parse_args(ctx, args)

    def main(
        self, args: Sequence[str] | None = None, prog_name: str | None = None, *a: Any, **kw: Any
    ) -> int:
        standalone = kw.pop("standalone_mode", True)
        kw["standalone_mode"] = False
        try:
            code = super().main(args, prog_name or PROG, *a, **kw)
        except TyperException as err:  # usage errors: bad option, missing TARGET, bad value
            code = fail(err.format_message(), _usage_hint(list(args or sys.argv[1:])), ExitCode.USAGE)
        except typer.Abort:  # Click's word for Ctrl-C (and end of input)
            code = fail("interrupted", "", ExitCode.INTERRUPTED)
        code = ExitCode.OK if code is None else int(code)
        if standalone:
            sys.exit(code)
        return code


app = typer.Typer(
    cls=_DefaultCommandGroup,
    help="See what each JAX checkpoint policy saves, recomputes and offloads, Transformer Engine GEMMs "
    "included.\n\nA TARGET alone runs audit: `te-ckpt-audit model.py:loss`. Each command's --help "
    "describes its options.",
    add_completion=True,  # --install-completion, --show-completion: commands, policies, GPU names
    pretty_exceptions_enable=False,
    rich_markup_mode=None,  # plain Click help: it wraps cleanly at 80 columns
    context_settings={"help_option_names": ["-h", "--help"]},
)


@app.callback()
def _top(version: TopVersion = False) -> None:
    """See what each JAX checkpoint policy saves, recomputes and offloads, Transformer Engine GEMMs
    included.

    A TARGET alone runs audit: `te-ckpt-audit model.py:loss`. Each command's --help describes its
    options."""


# Each command's options in groups, the common ones first, by the parameter's name (every option is
# placed: tests/test_cli.py); a command may place a shared option elsewhere (OWN_PANELS).
FIRST = "Options"
PANELS = {
    FIRST: ("target", "config", "settings", "policy", "inputs", "define", "scope", "params", "remat3", "name_lines",
            "allow_offload",
            "max_evals", "no_presets", "recommend", "batch", "layout"),
    "Report": ("equations", "top", "by", "format", "output"),
    "Gates (exit 1 when one fails)": ("budget", "max_recompute", "baseline", "tolerance", "require_baseline",
                                      "save_baseline_to", "save_baseline_flag", "fit", "peak_budget"),
    "Compiling the step (--gpu needs the [gpu] extra, --tpu the [tpu] extra)": (
        "compile", "mesh", "shardings", "gpu", "tpu", "gpu_config", "gpus_per_host", "optimizer", "mem_fraction",
        "step", "donate", "max_compiles", "maximize", "synthesize", "jobs", "cluster", "timed", "network_gbps",
        "calibrate"),
    "Other": ("debug", "version", "emulate_gpu", "help"),
}
OWN_PANELS = {
    "recommend": {"budget": FIRST, "mesh": FIRST},  # the budget it searches for, not a gate
    "maxtext": {"max_compiles": FIRST, "maximize": FIRST, "synthesize": FIRST},  # with --recommend, which compiles
}


def panel_of(command: str, name: str) -> str | None:
    """The help group of `command`'s option `name`."""
    own = OWN_PANELS.get(command, {})
    return own.get(name) or next((panel for panel, names in PANELS.items() if name in names), None)


class _GroupedCommand(TyperCommand):
    """Plain Click help (it wraps cleanly at 80 columns) with the options in PANELS' groups."""

    def format_options(self, ctx: Any, formatter: Any) -> None:  # Typer's own Click's Context and HelpFormatter
        groups: dict[str, list[tuple[str, str]]] = {}
        arguments = []
        for param in self.get_params(ctx):
            record = param.get_help_record(ctx)
            if record is None:
                continue
            if param.param_type_name == "argument":
                arguments.append(record)
            else:
                groups.setdefault(panel_of(self.name or "", param.name or "") or FIRST, []).append(record)
        if arguments:
            with formatter.section("Arguments"):
                formatter.write_dl(arguments)
        for panel in PANELS:
            if groups.get(panel):
                with formatter.section(panel):
                    formatter.write_dl(groups[panel])


def _examples(*lines: str) -> str:
    """An Examples epilogue, as `git` and `pip` end their help: Click keeps a `\\b` paragraph as written."""
    return "\b\nExamples:\n" + "\n".join(f"  {line}" for line in lines)


def _keys() -> str:
    """The config's keys, as `check` reads them (docs/reference/config.md says each)."""
    from te_ckpt_audit.config import SECTION_KEYS, TARGET_KEYS

    return ("Keys of [tool.te-ckpt-audit]: " + ", ".join(SECTION_KEYS) + ".\n\nKeys of each "
            "[[tool.te-ckpt-audit.targets]]: " + ", ".join(TARGET_KEYS) + ". docs/reference/config.md "
            "describes each.")


EXAMPLES = {
    DEFAULT_COMMAND: _examples(
        "te-ckpt-audit sample_models/te_transformer.py:loss",
        "te-ckpt-audit sample_models/gpt.py:loss -p checkpoint_dots -p nothing_saveable -D seq=256",
        "te-ckpt-audit sample_models/gpt.py:loss -f html -o report.html",
        "te-ckpt-audit sample_models/gpt.py:loss --budget 1MiB          # exit 1 over it",
        "te-ckpt-audit sample_models/gpt.py:loss --gpu h100 --mesh data=8 -D batch=16 --time  # [gpu] extra",
    ),
    "check": _examples("te-ckpt-audit check", "te-ckpt-audit check --format github",
                       "te-ckpt-audit check --save-baseline") + "\n\n" + _keys(),
    "policies": _examples("te-ckpt-audit policies"),
    "gpus": _examples("te-ckpt-audit gpus"),
    "tpus": _examples("te-ckpt-audit tpus"),
    "recommend": _examples(
        "te-ckpt-audit recommend sample_models/gpt.py:loss --budget 1MiB",
        "te-ckpt-audit recommend sample_models/gpt.py:loss --gpu h100              # [gpu] extra",
        "te-ckpt-audit recommend sample_models/gpt.py:loss --gpu h100 --maximize throughput",
    ),
    "maxtext": _examples(
        "te-ckpt-audit maxtext llama2_7b.yml ici_fsdp_parallelism=8 --gpu h100 -p minimal -p full",
        "te-ckpt-audit maxtext llama2_7b.yml ici_fsdp_parallelism=8 --gpu h100 --time",
        "te-ckpt-audit maxtext llama2_7b.yml ici_fsdp_parallelism=8 --gpu h100 --recommend --maximize throughput",
    ),
}

app.command(DEFAULT_COMMAND, cls=_GroupedCommand,
            short_help="Compare checkpoint policies on TARGET (the default command).",
            epilog=EXAMPLES[DEFAULT_COMMAND])(audit)
app.command("check", cls=_GroupedCommand, short_help="Gate CI: audit every target of [tool.te-ckpt-audit].",
            epilog=EXAMPLES["check"])(check)
app.command("policies", cls=_GroupedCommand, short_help="List every policy spec --policy understands.",
            epilog=EXAMPLES["policies"])(policies)
app.command("gpus", cls=_GroupedCommand, short_help="List the GPU models --gpu compiles a training step for.",
            epilog=EXAMPLES["gpus"])(gpus)
app.command("tpus", cls=_GroupedCommand, short_help="List the TPU chips and their figures, each with its source.",
            epilog=EXAMPLES["tpus"])(tpus)
app.command("recommend", cls=_GroupedCommand, short_help="Find the policy that fits --budget with the least recompute.",
            epilog=EXAMPLES["recommend"])(recommend)
app.command("maxtext", cls=_GroupedCommand, short_help="Audit MaxText's own train step per remat_policy, for GPUs too.",
            epilog=EXAMPLES["maxtext"])(maxtext)


def run(args: Sequence[str]) -> int:
    """Run the command line on `args`; its exit code. SIGTERM ends it as Ctrl-C does."""
    end_on_sigterm()
    return int(typer.main.get_command(app).main(list(args), PROG, standalone_mode=False))
