"""Does the replay flip to the bench's verdict on the fresh-row rule once its step times are the
bench's measured ones (`true_itl.py`)? The live steps were 0-14% dearer than profiled,
unevenly over K. First `replay_k1_while_fresh.py`'s table at the A/B's profile, then:

    PYTHONPATH=benchmarks/results/replay:benchmarks/results/b4_k0:benchmarks/results/fresh_row_draft \\
        python benchmarks/results/fresh_row_draft/replay_true_itl.py
"""
import sys

sys.argv = [sys.argv[0], "benchmarks/results/fresh_row_draft/bench_ab.profile.json"]
import replay_k1_while_fresh as r  # noqa: E402  (its variants, at the A/B's profile; prints its table first)
import true_itl  # noqa: E402

print("== step times: the profile x the bench's learnt ratios; controllers priced by the profile")
true_itl.compare(r.variants, (4, 8))
