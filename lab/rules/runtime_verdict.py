"""The runtime judges: an experiment becomes the runtime's argument list, and the runtime's own
parser, validate() and backend capability checks say what they refuse (torch-free, Ray-free).

The argument list is the one experiment.sh passes (`lab.core.argv.runtime_argv`: the train
command's flag groups with the shell variables filled in and the recipe's MODEL_ARGS first), judged with
`slime.dry_run.dry_run(..., environment=False)`: the flags alone, as on the target cluster (no file
existence, no installed-package check). Each refusal becomes a finding at the fields whose flags it
names (the `x-flag` / `x-flags` declarations of lab/core/experiment.py). No lab rule restates a runtime
rule: when the runtime gains a capability, its refusal, and the lab's finding, go away together.

Each refusal carries the runtime's stable code and parameters (slime.refusals.Refusal). The lab
words it in the page's language from the runtime's own catalogue (slime/locales/refusals.*.json,
seen as `runtime.<code>` by lab.core.messages): the same text the runtime prints, with its flags marked
as code. A refusal without a code, or with a code the catalogue does not word, is shown in the
runtime's own English, verbatim. Fields are found from the English text, whatever SLIME_LANG says.
"""
from __future__ import annotations

import re
import shlex
from typing import Any

from lab.core.argv import runtime_argv, server_groups
from lab.core.experiment import EXTRA_FLAGS_PATH, FIELD_FLAGS, Experiment, fields_of_flag
from lab.core.findings import Finding
from lab.core.memo import Memo
from lab.core.messages import DEFAULT_LANG, RUNTIME_PREFIX, catalogue, ref
from lab.core.recipes import Recipe, get_recipe
from lab.core.train_flags import extra_flag_tokens

_FLAG = re.compile(r"(?<![\w-])--[a-z0-9][a-z0-9-]*")


_JUDGED: Memo[Any] = Memo()  # keyed by the experiment's JSON
_FOUND: Memo[tuple[Finding, ...]] = Memo()


def judge(exp: Experiment, recipe: Recipe | None = None):
    """slime.dry_run.DryRun of this experiment (remembered per experiment)."""
    from slime.dry_run import dry_run

    def compute():
        r = recipe or get_recipe(exp.model.recipe)
        return dry_run(runtime_argv(exp, r), async_mode=exp.placement.scheduling == "async",
                       environment=False, groups=server_groups(exp, r))

    return _JUDGED.get(exp.model_dump_json(), compute)


def fields_for_message(message: str, extra: list[str]) -> list[str]:
    """The fields whose flags a runtime message names; the extra-flags field for flags it holds."""
    from slime.refusals import english

    fields: list[str] = []
    for flag in _FLAG.findall(english(message)):
        owners = fields_of_flag(flag)
        if flag in extra:
            owners = [EXTRA_FLAGS_PATH] + owners
        for f in owners:
            if f not in fields:
                fields.append(f)
    return fields or ["model.recipe"]  # a flag no control renders comes from the recipe


def runtime_findings(exp: Experiment) -> list[Finding]:
    """The runtime's refusals and warnings, each at the fields whose flags it names."""
    return [f.model_copy() for f in _FOUND.get(exp.model_dump_json(), lambda: tuple(_findings(exp)))]


RUNTIME_KEY = RUNTIME_PREFIX + "{code}"  # the catalogue key that words a runtime code


def runtime_finding(level: str, fields: list[str], message: str) -> Finding:
    """One runtime refusal (or warning) as a finding. params: `reason`, the runtime's English text;
    `code`, its stable code (None without one); `text`, what the message shows: the catalogue's
    wording of the code (a reference rendered in each language), else the English text itself."""
    from slime.refusals import code_of, english

    code, _ = code_of(message)
    return Finding.of("RUNTIME", level, fields, level, reason=english(message), code=code, text=runtime_text(message))


def runtime_text(message: str) -> Any:
    """A runtime message as a finding parameter: the catalogue's wording of its code (a reference
    rendered in each language), else its English text verbatim. A refusal that wraps another (a
    parameter that is itself a refusal) words the inner one the same way."""
    from slime.refusals import Refusal, code_of, english

    code, args = code_of(message)
    key = RUNTIME_KEY.format(code=code)
    if not (code and key in catalogue(DEFAULT_LANG)):
        return english(message)
    return ref(key, **{k: runtime_text(v) if isinstance(v, Refusal) else v for k, v in args.items()})


def _findings(exp: Experiment) -> list[Finding]:
    extra = extra_flag_tokens(exp)
    out = extra_flag_findings(exp)
    result = judge(exp)
    if result.cfg is None and extra:  # the extra flags do not parse: judge the rest without them
        out += [runtime_finding("error", [EXTRA_FLAGS_PATH], msg) for msg in result.errors]
        result = judge(exp.model_copy(update={"advanced": exp.advanced.model_copy(update={"extra_flags": ""})}))
    for msg in result.errors:
        out.append(runtime_finding("error", fields_for_message(msg, extra), msg))
    for msg in result.warnings:
        out.append(runtime_finding("warning", fields_for_message(msg, extra), msg))
    return out


def _all_runtime_flags() -> list[str]:
    from slime.flags import describe
    from slime.megatron_flags import MEGATRON_FLAGS

    return sorted({f.name for f in describe()} | set(MEGATRON_FLAGS))


def extra_flag_findings(exp: Experiment) -> list[Finding]:
    """Edit-time checks of advanced.extra_flags the parser alone cannot make: shell syntax, a value
    with no flag, and a flag that a control owns (refused: it points at the control)."""
    text = exp.advanced.extra_flags
    if not text.strip():
        return []
    try:
        tokens = shlex.split(text)
    except ValueError as exc:
        return [Finding.of("RUNTIME", "error", [EXTRA_FLAGS_PATH], "extra_syntax", error=str(exc))]
    out: list[Finding] = []
    if tokens and not tokens[0].startswith("--"):
        out.append(Finding.of("RUNTIME", "error", [EXTRA_FLAGS_PATH], "extra_value", value=tokens[0]))
    for tok in tokens:
        if not tok.startswith("--"):
            continue
        flag = tok.split("=", 1)[0]
        owners = [p for p in fields_of_flag(flag) if p != EXTRA_FLAGS_PATH]
        if flag in NOT_A_RUN_FLAG:
            out.append(Finding.of("RUNTIME", "error", [EXTRA_FLAGS_PATH], "extra_not_a_run", flag=flag))
        elif owners:
            out.append(Finding.of("RUNTIME", "error", [EXTRA_FLAGS_PATH, *owners], "extra_owned",
                                  flag=flag, field=owners[0]))
    return out


# Flags that change what the command does rather than the run: never part of a launched run.
NOT_A_RUN_FLAG = frozenset({"--dry-run"})


def advanced_flags() -> list[str]:
    """Runtime flags no control renders: reachable only through advanced.extra_flags."""
    owned = {f for flags in FIELD_FLAGS.values() for f in flags}
    return [f for f in _all_runtime_flags() if f not in owned and f not in NOT_A_RUN_FLAG]


def placement(exp: Experiment) -> list[dict[str, Any]]:
    """The runtime's placement plan of this experiment (slime.ray.placement.placement_plan)."""
    result = judge(exp)
    if result.cfg is None and exp.advanced.extra_flags:  # unreadable extra flags: the plan of the rest
        result = judge(exp.model_copy(update={"advanced": exp.advanced.model_copy(update={"extra_flags": ""})}))
    return [{"role": s.role, "index": s.index, "node": s.node, "gpus": list(s.gpus), "nodes": list(s.nodes),
             "address": s.address, "beside": s.beside, "where": s.where()} for s in result.plan]


def placement_lines(plan: list[dict[str, Any]]) -> list[str]:
    """The plan as `experiment.sh check` prints it (slime.ray.placement.format_plan)."""
    from slime.ray.placement import Slot, format_plan

    return format_plan([Slot(s["role"], s["index"], s["node"], tuple(s["gpus"]), tuple(s["nodes"]), s["address"],
                             s["beside"]) for s in plan])


__all__ = ["runtime_findings", "judge", "placement", "placement_lines", "advanced_flags"]
