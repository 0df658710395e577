"""An example of your own reward function for phase 3 (TRL's signature), used as

    python phase3_train_grpo.py --set grpo.reward_funcs=recipes/rewards_example.py:brevity --set grpo.reward_weights=0.1

or in a --config file: `reward_funcs: [recipes/rewards_example.py:brevity]`, `reward_weights: [0.1]`.
It runs in the training process (your code, trusted), never inside the sandbox.
"""


def brevity(prompts, completions, code, status, **columns):
    """Among programs that pass, shorter code is better: 1 for <= 200 characters, falling to 0 at 1000.

    `code` is the extracted program (None when the answer had none) and `status` the sandbox verdict;
    returning None for the others means "does not apply": they keep the built-in reward only.
    """
    return [
        max(0.0, min(1.0, (1000 - len(c)) / 800)) if s == "passed" and c else None
        for c, s in zip(code, status, strict=True)
    ]
