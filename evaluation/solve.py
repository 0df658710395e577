"""Try a model on one problem: `python -m evaluation.solve "Write a function add(a, b)..." [--assert ...]`

Shows the thinking, the extracted code and, when tests are given, the sandbox verdict. The quick look
a user wants after training: `--model_path outputs/final_model` (default) or any checkpoint or base model.
"""

from __future__ import annotations

import argparse
import sys

from config import ConfigError, add_config_arguments, config_from_args, exit_on_config_error


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("problem", help="The problem statement.")
    parser.add_argument("--model_path", help="Adapter, checkpoint-* folder or base model (default: final_model in the "
                        "resolved paths.output_dir, e.g. outputs/final_model).")
    parser.add_argument("--assert", dest="asserts", action="append", default=[],
                        help="An MBPP-style test, e.g. --assert 'assert add(1, 2) == 3' (repeatable; the first is shown "
                        "in the prompt, like phase 4 does).")
    parser.add_argument("--samples", type=int, default=1, help="How many answers to sample (default 1).")
    parser.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default).")
    parser.add_argument("--max_new_tokens", type=int, default=512, help="Token budget per answer.")
    add_config_arguments(parser)
    args = parser.parse_args(argv)
    try:
        config = config_from_args(args)
    except ConfigError as error:
        exit_on_config_error(error)

    from evaluation.code_executor import execute_program
    from phase4_evaluate import default_model_path, resolve_model
    from rollouts.sampling import SamplingSettings
    from utils.dataset_loader import Task, TaskSchemaError, entry_point_from_asserts
    from utils.prompts import get_unified_prompt
    from utils.student_model import ModelLoadError, generate_completions, load_adapter, load_student
    from utils.thinking_extraction import extract_thinking_and_code_unified

    task = None
    if args.asserts:  # checked before the model loads: a test that cannot fail must not print "passed"
        try:
            task = Task(task_id="solve/1", source="solve", problem=args.problem, test_type="assert",
                        tests=tuple(args.asserts), fn_name=entry_point_from_asserts(args.asserts))
        except TaskSchemaError as error:
            print(f"error: --assert: {error}.", file=sys.stderr)
            return 2
    try:
        base, adapter = resolve_model(args.model_path or str(default_model_path(config)), config)
        model, tokenizer = load_student(base, config.student.torch_dtype, config.student.load_in_8bit, config.paths.model_cache_dir)
    except ModelLoadError as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    if adapter is not None:
        model = load_adapter(model, adapter)
    prompt = get_unified_prompt(task if task else args.problem, config.prompt.num_visible_tests)
    samples = generate_completions(model, tokenizer, [prompt], num_samples=args.samples, max_new_tokens=args.max_new_tokens,
                                   sampling=SamplingSettings(args.temperature, config.evaluation.top_p, config.evaluation.top_k,
                                                             config.evaluation.min_p, config.evaluation.repetition_penalty),
                                   chat_template_kwargs={"enable_thinking": config.student.enable_thinking})[0]
    for i, sample in enumerate(samples, start=1):
        parsed = extract_thinking_and_code_unified(sample["text"])
        print(f"\n===== answer {i}/{len(samples)} ({sample['num_tokens']} tokens, {sample['finish_reason']}) =====")
        print("--- thinking ---\n" + (parsed["thinking"] or "(none)"))
        print("--- code ---\n" + (parsed["code"] or "(no code found)"))
        if task is not None:
            result = execute_program(parsed["code"], task)
            print(f"--- verdict: {result.status} ({result.tests_passed}/{result.tests_total} tests)"
                  + (f": {result.error}" if result.error else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
