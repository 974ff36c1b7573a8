"""ingot's generator: python -m codegen MODEL_DIR --out generated/<name>
                      python -m codegen --generic --out generated/generic [--chat-templates FILE...]

Reads MODEL_DIR/config.json (and the chat template in tokenizer_config.json), derives the spec
and renders one file per template into the output folder. Exits 1 with one line naming the
problem when the model cannot be built.

With --generic it renders the same templates for no model in particular: the dimensions become
values the binary reads from a model's config.json at run time, and the chat strings a table of
the templates given with --chat-templates (tokenizer_config.json or .jinja files).
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path

from .chat import ChatError, known_templates, load_chat_strings
from .plan import PlanError, header_constants, make_generic_plan, make_plan, parse_sets
from .render import GENERATOR_VERSION, REPO_ROOT, make_env, write_if_changed
from .spec import LAYER_MATRIX_FIELDS, MATRIX_TENSORS, SpecError, load_spec

# template -> generated file
OUTPUTS = {
    "model_config.h.j2": "model_config.h",
    "model_tensors.c.j2": "model_tensors.c",
    "forward_cpu.c.j2": "forward_cpu.c",
    "model_plan.h.j2": "model_plan.h",
    "model_chat.h.j2": "model_chat.h",
}
# A generic build reads its tensor table from the run-time spec (runtime/model_spec.c).
GENERIC_OUTPUTS = {t: o for t, o in OUTPUTS.items() if o != "model_tensors.c"}


def display_path(p: Path) -> str:
    """p relative to the repo root when inside it, so generated banners do not depend on where
    the repo is checked out."""
    p = p.resolve()
    try:
        return str(p.relative_to(REPO_ROOT))
    except ValueError:
        return str(p)


def render_all(outputs: dict, out_dir: Path, **context) -> list[Path]:
    env = make_env()
    changed = []
    for template, output in outputs.items():
        text = env.get_template(template).render(template=template, output=output, generator_version=GENERATOR_VERSION,
                                                 matrix_tensors=MATRIX_TENSORS, layer_matrix_fields=LAYER_MATRIX_FIELDS,
                                                 **context)
        path = out_dir / output
        if write_if_changed(path, text):
            changed.append(path)
    return changed


def generate(model_dir: Path, out_dir: Path, cuda_arch: str = "90", sets: dict | None = None) -> list[Path]:
    """Renders every template for the model; returns the files that changed. sets: plan decisions
    set by hand ({field: value}, codegen.plan.parse_sets)."""
    model_path = display_path(model_dir)
    spec = load_spec(model_dir / "config.json", name=model_dir.resolve().name)
    spec = dataclasses.replace(spec, config_path=model_path + "/config.json")
    try:
        chat = load_chat_strings(model_dir)
    except ChatError as e:
        raise SpecError(str(e)) from None
    try:
        plan = make_plan(spec, cuda_arch, sets)
    except PlanError as e:
        raise SpecError(str(e)) from None
    set_text = " ".join(f"{k}={v}" for k, v in sorted((sets or {}).items()))
    return render_all(OUTPUTS, out_dir, generic=False, spec=spec, plan=plan, chat=chat,
                      plan_constants=header_constants(plan, spec.head_dim), plan_sets=set_text,
                      regenerate=f"make generate MODEL={model_path}" + (f" PLAN='{set_text}'" if set_text else ""))


def generate_generic(out_dir: Path, cuda_arch: str = "90", chat_templates: list | None = None) -> list[Path]:
    """Renders the templates of the generic build; returns the files that changed."""
    try:
        known = known_templates(chat_templates or [], display=display_path)
    except (ChatError, OSError) as e:
        raise SpecError(str(e)) from None
    plan = make_generic_plan(cuda_arch)
    return render_all(GENERIC_OUTPUTS, out_dir, generic=True, spec=None, plan=plan, chat=None, known_chats=known,
                      plan_constants=header_constants(plan, "MODEL_HEAD_DIM"), plan_sets="",
                      regenerate="make generate GENERIC=1")


def one_line(message: str) -> str:
    """A message that quotes input, made one printable line as runtime/errors.c makes its own:
    control characters as \\xNN."""
    return "".join(c if c >= " " and not 0x7F <= ord(c) <= 0x9F else f"\\x{ord(c):02X}" for c in message)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m codegen", description=__doc__.splitlines()[0])
    ap.add_argument("model_dir", type=Path, nargs="?", help="Hugging Face model directory (config.json, tokenizer files)")
    ap.add_argument("--out", type=Path, required=True, help="output folder, e.g. generated/<name>")
    ap.add_argument("--cuda-arch", default="90", choices=["80", "89", "90"], help="GPU target (default 90)")
    ap.add_argument("--generic", action="store_true", help="the generic build's sources, for any model (no MODEL_DIR)")
    ap.add_argument("--set", action="append", default=[], metavar="FIELD=N",
                    help="set a plan decision by hand (codegen/plan.py's Plan field), e.g. --set mlp_fused=0; "
                         "--set generic: every decision as the generic build takes it")
    ap.add_argument("--chat-templates", type=Path, nargs="*", default=[],
                    help="--generic: the chat templates it knows (tokenizer_config.json or .jinja files)")
    args = ap.parse_args(argv)
    if args.generic == (args.model_dir is not None):
        ap.error("give either MODEL_DIR or --generic")
    try:
        sets = parse_sets(args.set, args.cuda_arch)
        if sets and args.generic:
            raise SpecError("--set: the generic build's plan is fixed (its dimensions are known only at run time)")
        if args.generic:
            changed = generate_generic(args.out, args.cuda_arch, args.chat_templates)
        else:
            changed = generate(args.model_dir, args.out, args.cuda_arch, sets)
    except (SpecError, PlanError) as e:
        print(one_line(f"codegen: {args.model_dir or 'generic'}: {e}"), file=sys.stderr)
        return 1
    for p in changed:
        print(f"codegen: wrote {display_path(p)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
