"""`slime-lab`: the Quick Start lab from a terminal. Same functions as the page, same bytes.

    slime-lab [--host H] [--port P]             # serve the page on 127.0.0.1:8765
    slime-lab serve [--host H] [--port P] [--allow-host NAME ...] [--openapi] [--workers N]
    slime-lab recipes
    slime-lab render (--model NAME | EXPERIMENT.json) [--set field.path=value ...] -o DIR
    slime-lab validate EXPERIMENT.json [--fix]  # exit 1 on errors; --fix: also the repair previews
    slime-lab repair EXPERIMENT.json [--apply ID -o OUT.json]
    slime-lab schema
    slime-lab share EXPERIMENT.json | slime-lab share --open LINK

Exit codes: 0 ok, 1 validation errors (validate), 2 bad input (a message, no traceback, nothing
is written), 3 an internal error (a message naming it; nothing is written either). Files are
written all or nothing (lab.render.write_files).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any, NoReturn, Sequence

from lab.core.experiment import Experiment, experiment_schema


class UserError(Exception):
    """Bad input from the command line: printed as one message, exit 2."""


def _fail(msg: str, code: int = 2) -> NoReturn:
    print(f"slime-lab: error: {msg}", file=sys.stderr)
    raise SystemExit(code)


def load_experiment_file(path: str) -> Experiment:
    """An experiment from a file the page's Load JSON accepts: our export, a schema-1 export, or a
    (partial) choices object; fields it leaves out take its recipe's defaults."""
    from lab.core.change import ChangeError
    from lab.core.load_json import LoadError, parse_document
    from lab.rules.edit import fresh_workspace, replace_b

    try:
        raw = Path(path).read_bytes()
    except FileNotFoundError:
        raise UserError(f"{path}: file not found") from None
    except OSError as exc:
        raise UserError(f"{path}: cannot read: {exc}") from None
    try:
        loaded = parse_document(raw)
        return replace_b(fresh_workspace(), loaded.choices, f"load {path}").b
    except LoadError as exc:
        raise UserError(f"{path}: {exc}") from None
    except ChangeError as exc:
        raise UserError(f"{path}: {exc}") from None


def parse_set(item: str) -> tuple[str, Any]:
    """"field.path=value": the value as JSON when it parses (8, true, ["a"]), else the raw string."""
    if "=" not in item:
        raise UserError(f"--set {item!r}: expected field.path=value, e.g. --set placement.ownership=colocated")
    from lab.core.safe_json import JSONInputError, loads

    path, raw = item.split("=", 1)
    path = path.strip()
    try:
        value = loads(raw)
    except JSONInputError as exc:
        if exc.key != "input.not_json":  # NaN, 1e999, a 5,000-digit number: refused, not taken as text
            raise UserError(f"--set {path}: {exc}") from None
        value = raw
    return path, value


def build_experiment(model: str | None, source: str | None, sets: Sequence[str]) -> Experiment:
    from lab.core.change import ChangeError
    from lab.core.recipes import RecipeError, get_recipe
    from lab.rules.dependents import apply_change, new_experiment

    if model is not None:
        try:
            get_recipe(model)
        except RecipeError as exc:
            raise UserError(f"--model: {exc}") from None
        exp = new_experiment(model)
    else:
        assert source is not None
        exp = load_experiment_file(source)
        try:
            get_recipe(exp.model.recipe)
        except RecipeError as exc:
            raise UserError(f"{source}: model.recipe: {exc}") from None
    for item in sets:
        path, value = parse_set(item)
        try:
            exp, _ = apply_change(exp, path, value)
        except ChangeError as exc:
            raise UserError(f"--set {path}: {exc.message}") from None
        except Exception as exc:  # e.g. RecipeError for model.recipe
            raise UserError(f"--set {path}: {exc}") from None
    return exp


# --- commands -----------------------------------------------------------------------------------

def _workers(text: str) -> int:
    try:
        n = int(text)
    except ValueError:
        n = 0
    if not 1 <= n <= 64:
        raise argparse.ArgumentTypeError(f"--workers takes a whole number of processes from 1 to 64, not {text!r}")
    return n


def cmd_serve(args: argparse.Namespace) -> int:
    import uvicorn

    from lab.web.app import APP_SETTINGS_ENV, create_app
    from lab.web.guard import WILDCARD_HOSTS

    allow = args.allow_host or []
    url = f"http://{args.host}:{args.port}/"
    print(f"slime-lab: serving the Quick Start lab at {url} (Ctrl-C stops it)", flush=True)
    if args.host not in ("127.0.0.1", "localhost", "::1"):
        print(f"slime-lab: note: --host {args.host} exposes the lab beyond this machine", file=sys.stderr)
    if args.host in WILDCARD_HOSTS and not allow:
        print("slime-lab: note: requests must name this machine as 127.0.0.1 or localhost; to open the lab "
              "under another name or address, add --allow-host NAME", file=sys.stderr)
    if args.workers > 1:  # each process builds its own app from the same settings (lab.web.app.app_from_env)
        os.environ[APP_SETTINGS_ENV] = json.dumps({"host": args.host, "allow_hosts": allow, "openapi": args.openapi})
        uvicorn.run("lab.web.app:app_from_env", factory=True, host=args.host, port=args.port, workers=args.workers,
                    log_level="warning")
        return 0
    app = create_app(host=args.host, allow_hosts=allow, openapi=args.openapi)
    uvicorn.run(app, host=args.host, port=args.port, log_level="warning")
    return 0


def cmd_recipes(args: argparse.Namespace) -> int:
    from lab.core.recipes import all_recipes

    recipes = all_recipes()
    width = max(len(n) for n in recipes)
    for name, r in recipes.items():
        print(f"{name:<{width}}  {r.display_name} — {r.summary}")
    return 0


def cmd_render(args: argparse.Namespace) -> int:
    from lab.render import write_files
    from lab.web.export import experiment_files

    if (args.model is None) == (args.experiment is None):
        raise UserError("give either --model NAME or an EXPERIMENT.json, not both (see: slime-lab recipes)")
    exp = build_experiment(args.model, args.experiment, args.set or [])
    files = experiment_files(exp)  # everything is rendered before anything is written
    out = Path(args.output)
    if out.exists() and not out.is_dir():
        raise UserError(f"-o {args.output}: exists and is not a directory")
    try:
        written = write_files(files, out)  # all or nothing
    except OSError as exc:
        raise UserError(f"-o {args.output}: cannot write the files ({exc.strerror or exc}); nothing was changed") from None
    for path in written:
        print(path)
    errors = [f for f in json.loads(files["experiment.json"])["findings"] if f["level"] == "error"]
    if errors:
        print(f"slime-lab: note: {len(errors)} validation error(s) are listed in experiment.sh; "
              "`train` refuses to submit until they are fixed", file=sys.stderr)
    return 0


def cmd_validate(args: argparse.Namespace) -> int:
    from lab.rules.validate import validate

    exp = load_experiment_file(args.experiment)
    findings = validate(exp)
    for f in findings:
        fields = ", ".join(f.fields)
        print(f"{f.level:<7} {f.id:<10} [{fields}] {f.message}")
        print(f"{'':<7} {'':<10} fix: {f.fix}")
    n_err = sum(f.level == "error" for f in findings)
    print(f"{len(findings)} finding(s), {n_err} error(s)")
    if args.fix:
        print()
        _print_repairs(exp, findings, args.experiment)
    return 1 if n_err else 0


def _print_repairs(exp: Experiment, findings: list, source: str) -> list:
    """The page's repair previews (lab.rules.repair.propose_repairs), as text: nothing is applied."""
    from lab.rules.repair import propose_repairs

    repairs = propose_repairs(exp, findings=findings)
    if not repairs:
        print("no repair to propose")
        return repairs
    for r in repairs:
        print(f"repair {r.id}: {r.title}")
        print(f"  fixes {r.fixes}: {r.finding.message if r.finding else ''}")
        for c in r.changes:
            why = f"  ({c.reason})" if c.reason else ""
            print(f"  {c.path}: {json.dumps(c.old)} -> {json.dumps(c.new)}{why}")
        alloc = ", ".join(f"{k} {v}" for k, v in r.allocation.items())
        print(f"  allocation after: {alloc}")
        for q in r.requires:
            print(f"  still required from you: {q.text}")
        for f in r.remaining:
            print(f"  still an error after it: {f.id}: {f.message}")
    print(f"apply one with: slime-lab repair {source} --apply ID -o REPAIRED.json")
    return repairs


def cmd_repair(args: argparse.Namespace) -> int:
    """Preview the repairs (as the page does); with --apply ID, write the repaired experiment."""
    from lab.core.change import ChangeError
    from lab.core.workspace import Workspace
    from lab.render import write_files
    from lab.rules.repair import apply_repair
    from lab.rules.validate import validate
    from lab.web.export import experiment_files

    if (args.apply is None) != (args.output is None):
        raise UserError("--apply ID and -o OUT.json go together: the repair to apply, and where to write the result")
    exp = load_experiment_file(args.experiment)
    if args.apply is None:
        _print_repairs(exp, validate(exp), args.experiment)
        return 0
    try:
        repaired = apply_repair(Workspace(b=exp), args.apply).b
    except ChangeError:
        from lab.rules.repair import propose_repairs

        ids = ", ".join(r.id for r in propose_repairs(exp)) or "none"
        raise UserError(f"--apply {args.apply}: no such repair for {args.experiment} (repairs now: {ids})") from None
    out = Path(args.output)
    if out.is_dir():
        raise UserError(f"-o {args.output}: is a directory; give a file name, e.g. -o repaired.json")
    data = experiment_files(repaired)["experiment.json"]  # the page's export: slime-lab render/validate read it back
    try:
        write_files({out.name: data}, out.parent if str(out.parent) else ".")
    except OSError as exc:
        raise UserError(f"-o {args.output}: cannot write ({exc.strerror or exc}); nothing was changed") from None
    errors = [f for f in validate(repaired) if f.level == "error"]
    print(f"applied {args.apply}; wrote {out} ({len(errors)} error(s) left)")
    return 0


def cmd_schema(args: argparse.Namespace) -> int:
    print(json.dumps(experiment_schema(), indent=2, sort_keys=True))
    return 0


def cmd_import(args: argparse.Namespace) -> int:
    """Read a hand-written launch script (nothing is executed): B against the closest recipe as A."""
    from lab.rules.import_script import ScriptImportError, import_script, script_text
    from lab.web.export import experiment_files

    path = Path(args.script)
    try:
        result = import_script(script_text(path), path)
    except OSError as exc:
        print(f"error: {path}: {exc}", file=sys.stderr)
        return 2
    except ScriptImportError as exc:
        print(f"error: {path}: {exc} (nothing was changed)", file=sys.stderr)
        return 1
    a, b = result.a.model_dump(mode="json"), result.b.model_dump(mode="json")
    from lab.core.experiment import LEAF_FIELDS, get_path

    diff = [{"field": p, "a": get_path(a, p), "b": get_path(b, p)} for p in sorted(LEAF_FIELDS) if get_path(a, p) != get_path(b, p)]
    for flag in result.unknown:
        print(f"note: {path}:{result.lines[flag]}: {flag} has no control; kept in advanced.extra_flags", file=sys.stderr)
    for item in result.report:  # every difference between the script's command and the rendered one
        what = item.flag or " ".join(item.script or [])
        print(f"{item.kind}: {path}:{item.line}: {what}: {item.why}", file=sys.stderr)
    print(json.dumps({"a": result.a.model.recipe, "model": result.model, "entry": result.entry,
                      "unknown_flags": result.unknown, "unset_flags": list(result.b.advanced.unset_flags),
                      "report": [item.as_dict() for item in result.report], "differences": diff, "b": b},
                     indent=2, sort_keys=True))
    if args.out:
        from lab.render import write_files

        write_files(experiment_files(result.b), args.out)
    return 0


def cmd_share(args: argparse.Namespace) -> int:
    from lab.core import share
    from lab.rules.open_share import checked_choices

    if args.open is not None:
        if args.experiment is not None:
            raise UserError("give either EXPERIMENT.json or --open LINK, not both")
        try:
            sides = checked_choices(args.open)
        except share.ShareError as exc:
            raise UserError(f"--open: {exc}") from None
        print(json.dumps(sides.get("choices", sides), indent=2, sort_keys=True, allow_nan=False))
        return 0
    if args.experiment is None:
        raise UserError("give EXPERIMENT.json to make a link, or --open LINK to read one")
    print(share.encode_link(load_experiment_file(args.experiment)))
    return 0


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="slime-lab", description="The slime Quick Start lab.")
    sub = ap.add_subparsers(dest="command")

    s = sub.add_parser("serve", help="serve the page (default: 127.0.0.1:8765)")
    s.add_argument("--host", default="127.0.0.1")
    s.add_argument("--port", type=int, default=8765)
    s.add_argument("--allow-host", action="append", metavar="NAME",
                   help="also answer requests that name this host (a proxy's name, this machine's address); "
                        "others are refused, so a web page cannot drive the lab through DNS rebinding")
    s.add_argument("--openapi", action="store_true", help="serve the API description at /openapi.json")
    s.add_argument("--workers", type=_workers, default=1, metavar="N",
                   help="server processes (default 1). The lab keeps no session, so a lab shared by many "
                        "users can answer on N cores: one process answers one edit at a time")
    s.set_defaults(func=cmd_serve)

    s = sub.add_parser("recipes", help="list the models (first column: the name --model takes)")
    s.set_defaults(func=cmd_recipes)

    s = sub.add_parser("render", help="write experiment.sh, experiment.json (and serving-reference.sh)")
    s.add_argument("experiment", nargs="?", help="EXPERIMENT.json (an export or a bare experiment)")
    s.add_argument("--model", help="start from a recipe's defaults (see: slime-lab recipes)")
    s.add_argument("--set", action="append", metavar="FIELD.PATH=VALUE",
                   help="change one field (dependent fields follow); VALUE is JSON when it parses, else a string")
    s.add_argument("-o", "--output", required=True, metavar="DIR", help="directory for the files")
    s.set_defaults(func=cmd_render)

    s = sub.add_parser("validate", help="print the findings; exit 1 when any is an error")
    s.add_argument("experiment", help="EXPERIMENT.json")
    s.add_argument("--fix", action="store_true", help="also print the repairs the page offers (see: slime-lab repair)")
    s.set_defaults(func=cmd_validate)

    s = sub.add_parser("repair", help="preview the page's repairs of the findings; --apply ID -o OUT.json writes one")
    s.add_argument("experiment", help="EXPERIMENT.json")
    s.add_argument("--apply", metavar="ID", help="the repair to apply, by the id its preview prints")
    s.add_argument("-o", "--output", metavar="OUT.json", help="where to write the repaired experiment")
    s.set_defaults(func=cmd_repair)

    s = sub.add_parser("schema", help="print the experiment's JSON schema")
    s.set_defaults(func=cmd_schema)

    s = sub.add_parser("import", help="read a hand-written launch script (run-*.sh) into an experiment; executes nothing")
    s.add_argument("script", help="the launch script")
    s.add_argument("--out", help="also render experiment.sh and experiment.json of the imported B into this directory")
    s.set_defaults(func=cmd_import)
    s = sub.add_parser("share", help="make a share link (private fields stripped), or --open one")
    s.add_argument("experiment", nargs="?", help="EXPERIMENT.json")
    s.add_argument("--open", metavar="LINK", help="print the choices a link carries (A/B links: both sides), "
                                                  "after checking them as the page would")
    s.set_defaults(func=cmd_share)
    return ap


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    argv = list(sys.argv[1:] if argv is None else argv)
    # `slime-lab --port 9000` means `slime-lab serve --port 9000`: serving is what a bare call does.
    if not argv or argv[0].startswith(("--host", "--port", "--allow-host", "--openapi")):
        argv = ["serve", *argv]
    args = parser.parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except UserError as exc:
        _fail(str(exc))
    except (KeyboardInterrupt, BrokenPipeError):
        raise SystemExit(130) from None
    except Exception as exc:  # noqa: BLE001 - a bug: one line naming it, never a traceback
        _fail(f"internal error ({type(exc).__name__}: {exc}); nothing was written. Please report it.", code=3)


if __name__ == "__main__":
    sys.exit(main())
