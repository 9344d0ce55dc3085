"""Host cost of a stop-string scan (`stop_strings.scan`) per dispatch: the built-in tokenizer
reading the 16 tokens a dispatch added to a completion of L tokens and searching them, when
nothing matches (what every dispatch pays), beside decoding the whole completion (what the
first version did, O(L) a dispatch)."""
import statistics
import time

from tokenizers import Tokenizer

from dsd_jax.models import heldout_prompts
from dsd_jax.models.builtin import BUILTIN_DIR
from dsd_jax.stop_strings import Text, scan

tok = Tokenizer.from_file(str(BUILTIN_DIR / "tokenizer.json"))
ids = [t for p in heldout_prompts(64) for t in tok.encode(p).ids]
stops = ["never seen", "</answer>"]


def median_us(f, setup=lambda: None, reps=300):
    times = []
    for _ in range(reps):
        arg = setup()
        t0 = time.perf_counter()
        f(arg)
        times.append(time.perf_counter() - t0)
    q = statistics.quantiles(times, n=4)
    return f"{statistics.median(times) * 1e6:6.1f} us (q25 {q[0] * 1e6:.1f}, q75 {q[2] * 1e6:.1f})"


for L in (64, 256, 1024, 4096):
    tokens = ids[:L]
    assert len(tokens) == L
    read = tok.decode(tokens[:L - 16])

    def earlier_scans():  # what the scans before this dispatch's read
        text = Text()
        text.text, text.read = read, L - 16
        return text

    def incremental(text):
        assert scan(tok.decode, tokens, L - 16, stops, text, include=False) is None

    whole = lambda _: tok.decode(tokens).find(stops[0])  # noqa: E731
    print(f"L={L:5d}: a scan of 16 new tokens {median_us(incremental, earlier_scans)}; "
          f"decoding all L {median_us(whole)}")
