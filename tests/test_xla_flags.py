"""The suite's own XLA flags: a flag this XLA no longer knows would abort every process
that starts a backend, so `xla_flags.fast_compile` asks a child process first."""

from xla_flags import OLD_FUSION_EMITTERS, OPT_LEVEL_0, fast_compile, known


def test_an_unknown_flag_is_refused_and_the_optimisation_level_kept():
    assert not known(f"{OPT_LEVEL_0} --xla_cpu_no_such_flag=true")
    assert known(OPT_LEVEL_0)
    both = f"{OPT_LEVEL_0} {OLD_FUSION_EMITTERS}"
    assert fast_compile() == (both if known(both) else OPT_LEVEL_0)
