"""Profile file: interpolation, validation on load, round trip, mismatch warnings."""

import copy
import json
import math
import warnings

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dsd_jax.profile import SCHEMA_VERSION, Profile, ProfileMismatchWarning

BS = [1, 4, 16]
CTX = [128, 1024]
KS = [0, 1, 2, 3]


def lat(c, b, k):
    return 5.0 + 0.01 * c + 0.5 * b * (k + 1) + 0.25 * k


def make(**kw):
    args = dict(
        device_kind="cpu",
        batch_sizes=BS,
        ks=KS,
        context_lengths=CTX,
        latency_ms=[[[lat(c, b, k) for k in KS] for b in BS] for c in CTX],
        acceptance=[0.8, 0.6, 0.45],
        platform="cpu",
        jax_version="0.10.2",
        method="draft_model",
        fingerprints={"target": "t-123", "draft": "d-456"},
        acceptance_by_temperature={"0.0": [0.9, 0.8, 0.7], "1.0": [0.7, 0.5, 0.3]},
        catchup_ms={"chunk": 32, "ms": [2.0, 3.0, 9.0]},
        meta={"note": "test"},
    )
    args.update(kw)
    return Profile(**args)


def test_exact_at_grid_points():
    p = make()
    for c in CTX:
        for b in BS:
            for k in KS:
                assert p.itl_ms(b, k, c) == lat(c, b, k)
    assert p.itl_ms(4, 2) == lat(128, 4, 2)  # None -> first context length


def test_interpolation_linear_in_batch_and_context():
    p = make()
    # lat is affine in b and in c separately, so bilinear interpolation is exact.
    for b, c, k in [(2, 128, 1), (10, 1024, 3), (7.5, 500, 2), (1, 576, 0), (13, 300.25, 1)]:
        assert p.itl_ms(b, k, c) == pytest.approx(lat(c, b, k), rel=1e-12)
    # Non-affine table: check the midpoint formula directly.
    t = np.array(make().latency_ms)
    t[1, 2, 1] *= 3.0
    q = make(latency_ms=t.tolist())
    mid_b = (4 + 16) / 2
    assert q.itl_ms(mid_b, 1, 1024) == pytest.approx((t[1, 1, 1] + t[1, 2, 1]) / 2)
    assert q.itl_ms(16, 1, (128 + 1024) / 2) == pytest.approx((t[0, 2, 1] + t[1, 2, 1]) / 2)
    assert q.itl_ms(mid_b, 1, (128 + 1024) / 2) == pytest.approx(t[:, 1:3, 1].mean())


def test_clamped_outside_range():
    p = make()
    assert p.itl_ms(0.5, 1, 128) == lat(128, 1, 1)
    assert p.itl_ms(1000, 2, 1024) == lat(1024, 16, 2)
    assert p.itl_ms(4, 3, 0) == lat(128, 4, 3)
    assert p.itl_ms(4, 3, 10**6) == lat(1024, 4, 3)
    assert p.itl_ms(10**4, 0, -5) == lat(128, 16, 0)


def test_itl_table_matches_itl_ms_bitwise():
    p = make()
    for c in (None, 128, 300, 1024, 5000):
        tab = p.itl_table(c)
        assert tab.shape == (16, 4)
        for b in range(1, 17):
            for k in KS:
                assert tab[b - 1, k] == p.itl_ms(b, k, c)
    assert p.itl_table(200, [3, 40]).shape == (2, 4)


def test_bad_queries():
    p = make()
    for k in (4, -1, 1.0, True, "1", None):
        with pytest.raises(ValueError, match="k must be"):
            p.itl_ms(4, k)
    for b in (float("nan"), float("inf"), "4", None, True):
        with pytest.raises(ValueError, match="batch_size"):
            p.itl_ms(b, 1)
    with pytest.raises(ValueError, match="context_len"):
        p.itl_ms(4, 1, float("nan"))


def test_two_d_form_and_acceptance_for():
    p = Profile("cpu", [1, 2], [0, 1], [[1.0, 2.0], [3.0, 4.0]], [0.5])
    assert p.context_lengths == [0] and p.itl_ms(1.5, 1) == 3.0 and p.itl_ms(2, 1, 4096) == 4.0
    q = make()
    assert q.acceptance_for(None).tolist() == [0.8, 0.6, 0.45]
    assert q.acceptance_for(0.2).tolist() == [0.9, 0.8, 0.7]
    assert q.acceptance_for(0.9).tolist() == [0.7, 0.5, 0.3]


def test_save_load_round_trip(tmp_path):
    p = make()
    path = tmp_path / "prof.json"
    p.save(path)
    d = json.loads(path.read_text())
    assert d["schema_version"] == SCHEMA_VERSION and set(d) == set(p.to_dict())
    q = Profile.load(path)
    assert q.to_dict() == p.to_dict()
    assert q.itl_ms(7, 2, 700) == p.itl_ms(7, 2, 700)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        Profile.load(path, expect_fingerprints={"target": "t-123", "draft": "d-456"}, expect_device_kind="cpu")


def test_mismatch_warnings(tmp_path):
    path = tmp_path / "prof.json"
    make().save(path)
    with pytest.warns(ProfileMismatchWarning) as rec:
        Profile.load(path, expect_fingerprints={"target": "t-999"})
    msg = str(rec[0].message)
    assert "t-123" in msg and "t-999" in msg and "target" in msg
    with pytest.warns(ProfileMismatchWarning) as rec:
        Profile.load(path, expect_device_kind="TPU v5e")
    msg = str(rec[0].message)
    assert "'cpu'" in msg and "TPU v5e" in msg
    with pytest.warns(ProfileMismatchWarning, match="'eagle'"):
        Profile.load(path, expect_fingerprints={"eagle": "e-1"})  # role absent from the profile
    assert issubclass(ProfileMismatchWarning, UserWarning)


def test_mesh_mismatch_warns(tmp_path):
    """A profile records its mesh; one without the field was measured on one device."""
    path = tmp_path / "prof.json"
    make().save(path)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        Profile.load(path, expect_mesh={"data": 1, "model": 1})
    with pytest.warns(ProfileMismatchWarning, match="mesh"):
        Profile.load(path, expect_mesh={"data": 1, "model": 4})
    p = make()
    p.meta["engine"] = {"mesh": {"data": 1, "model": 4}}
    p.save(path)
    assert Profile.load(path, expect_mesh={"data": 1, "model": 4}).mesh == {"data": 1, "model": 4}
    with pytest.warns(ProfileMismatchWarning, match="'model': 4"):
        Profile.load(path, expect_mesh={"data": 1, "model": 1})
    p.meta["engine"] = {"mesh": {"model": 4}}  # an axis left out has size 1: the same mesh
    p.save(path)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert Profile.load(path, expect_mesh={"data": 1, "model": 4}).mesh == {"data": 1, "model": 4}


def test_kernel_backends_checked_when_recorded(tmp_path):
    """A profile timed with other kernels (the H200's first profile ran Pallas rejection,
    "auto" now runs XLA's) warns; one that does not record them is not checked."""
    path = tmp_path / "prof.json"
    here = {"attention": "pallas", "rejection": "xla"}
    make().save(path)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert Profile.load(path, expect_kernel_backends=here).kernel_backends is None
    p = make()
    p.meta["engine"] = {"kernel_backends": {"attention": "pallas", "rejection": "pallas"}}
    p.save(path)
    with pytest.warns(ProfileMismatchWarning, match="timed with kernels .*'rejection': 'pallas'"):
        Profile.load(path, expect_kernel_backends=here)
    p.meta["engine"]["kernel_backends"] = here
    p.save(path)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert Profile.load(path, expect_kernel_backends=here).kernel_backends == here


def test_unreadable_files_name_the_file(tmp_path):
    with pytest.raises(ValueError, match="nope.json"):
        Profile.load(tmp_path / "nope.json")
    bad = tmp_path / "bad.json"
    bad.write_text("{ not json")
    with pytest.raises(ValueError, match="bad.json.*not valid JSON"):
        Profile.load(bad)
    bad.write_text("[1, 2]")
    with pytest.raises(ValueError, match="bad.json"):
        Profile.load(bad)
    bad.write_bytes(b"\xff\xfe\x00garbage")
    with pytest.raises(ValueError, match="bad.json"):
        Profile.load(bad)


def test_catchup_cell_round_trips_and_version_1_files_load_without_it(tmp_path):
    p = make()
    assert Profile.from_dict(p.to_dict()).catchup_ms == {"chunk": 32, "ms": [2.0, 3.0, 9.0]}
    d = make().to_dict()
    d["schema_version"] = 1
    del d["catchup_ms"]  # what a version 1 file holds
    path = tmp_path / "v1.json"
    path.write_text(json.dumps(d))
    q = Profile.load(path)
    assert q.catchup_ms is None and q.itl_ms(4, 2, 128) == p.itl_ms(4, 2, 128)
    assert q.to_dict()["schema_version"] == SCHEMA_VERSION == 2


@pytest.mark.parametrize(
    "mutate, needle",
    [
        (lambda d: d.pop("schema_version"), "missing schema_version"),
        (lambda d: d.update(schema_version=3), "unsupported schema_version 3"),
        (lambda d: d.update(schema_version=1), "unknown key(s) ['catchup_ms']"),
        (lambda d: d.pop("catchup_ms"), "missing key(s) ['catchup_ms']"),
        (lambda d: d["catchup_ms"]["ms"].pop(), "catchup_ms.ms must have one entry per batch size"),
        (lambda d: d["catchup_ms"]["ms"].__setitem__(2, -1.0), "catchup_ms.ms[2] (batch 16)"),
        (lambda d: d["catchup_ms"]["ms"].__setitem__(0, float("nan")), "catchup_ms.ms[0]"),
        (lambda d: d["catchup_ms"].update(chunk=0), "catchup_ms.chunk"),
        (lambda d: d.update(catchup_ms=[1.0]), "catchup_ms must be null or"),
        (lambda d: d.update(schema_version="1"), "schema_version"),
        (lambda d: d.update(schema_version=True), "schema_version"),
        (lambda d: d.pop("latency_ms"), "missing key(s) ['latency_ms']"),
        (lambda d: d.update(extra=1), "unknown key(s) ['extra']"),
        (lambda d: d["latency_ms"][1][2].pop(), "latency_ms[1][2] has 3 entries"),
        (lambda d: d["latency_ms"][0].pop(), "latency_ms[0] has 2 entries"),
        (lambda d: d["latency_ms"][1][0].__setitem__(1, 0.0), "latency_ms[1][0][1] (context 1024, batch 1, K 1)"),
        (lambda d: d["latency_ms"][0][0].__setitem__(0, -1.0), "positive finite"),
        (lambda d: d["latency_ms"][0][0].__setitem__(0, float("nan")), "positive finite"),
        (lambda d: d["latency_ms"][0][0].__setitem__(0, float("inf")), "positive finite"),
        (lambda d: d["latency_ms"][0][0].__setitem__(0, None), "must be a number"),
        (lambda d: d["latency_ms"][0][0].__setitem__(0, 10**400), "positive finite"),
        (lambda d: d["acceptance"].__setitem__(1, 1.5), "acceptance[1]"),
        (lambda d: d["acceptance"].__setitem__(0, -0.1), "acceptance[0]"),
        (lambda d: d["acceptance"].pop(), "acceptance must have one entry per draft position"),
        (lambda d: d.update(batch_sizes=[4, 1, 16]), "batch_sizes must be strictly increasing"),
        (lambda d: d.update(batch_sizes=[1, 4, 4]), "batch_sizes must be strictly increasing"),
        (lambda d: d.update(batch_sizes=[0, 4, 16]), "batch_sizes[0] must be >= 1"),
        (lambda d: d.update(context_lengths=[1024, 128]), "context_lengths"),
        (lambda d: d.update(context_lengths=[]), "context_lengths"),
        (lambda d: d.update(context_lengths=None), "context_lengths"),
        (lambda d: d.update(ks=[1, 2, 3, 4]), "contiguous from 0"),
        (lambda d: d.update(fingerprints=["x"]), "fingerprints"),
        (lambda d: d.update(device_kind=None), "device_kind"),
        (lambda d: d.update(meta=[]), "meta"),
        (lambda d: d["acceptance_by_temperature"].update({"hot": [0.1, 0.1, 0.1]}), "'hot'"),
        (lambda d: d["acceptance_by_temperature"]["0.0"].append(0.1), "acceptance_by_temperature['0.0']"),
        (lambda d: d["acceptance"].__setitem__(1, 0.9), "a_2 = 0.9 exceeds a_1 = 0.8"),
        (lambda d: d["acceptance_by_temperature"]["1.0"].__setitem__(2, 0.6),
         "acceptance_by_temperature['1.0']: a_3 = 0.6 exceeds a_2 = 0.5"),
    ],
)
def test_load_rejects(tmp_path, mutate, needle):
    d = make().to_dict()
    mutate(d)
    path = tmp_path / "p.json"
    path.write_text(json.dumps(d))
    with pytest.raises(ValueError) as e:
        Profile.load(path)
    assert needle in str(e.value) and "p.json" in str(e.value)


def test_failed_save_leaves_neither_file(tmp_path):
    path = tmp_path / "p.json"
    with pytest.raises(ValueError):  # NaN is not JSON (allow_nan=False)
        make(meta={"x": float("nan")}).save(path)
    assert list(tmp_path.iterdir()) == []


# ---------------------------------------------------------------- property test

def _paths(obj, prefix=()):
    """All (container-path) locations of leaves and containers in a JSON tree."""
    out = []
    if isinstance(obj, dict):
        for k, v in obj.items():
            out.append(prefix + (k,))
            out.extend(_paths(v, prefix + (k,)))
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            out.append(prefix + (i,))
            out.extend(_paths(v, prefix + (i,)))
    return out


def _get(obj, path):
    for p in path:
        obj = obj[p]
    return obj


BASE = make().to_dict()
LAT_CELLS = [(c, b, k) for c in range(len(CTX)) for b in range(len(BS)) for k in range(len(KS))]
BAD_LATENCY = st.sampled_from([0.0, -0.0, -1.0, float("nan"), float("inf"), -float("inf"), None, "1.0", [1.0], True])


@st.composite
def invalid_mutation(draw):
    d = copy.deepcopy(BASE)
    kind = draw(st.sampled_from(["drop_key", "latency", "version", "ragged", "acceptance", "axis", "type"]))
    if kind == "drop_key":
        d.pop(draw(st.sampled_from(sorted(d))))
    elif kind == "latency":
        c, b, k = draw(st.sampled_from(LAT_CELLS))
        d["latency_ms"][c][b][k] = draw(BAD_LATENCY)
    elif kind == "version":
        d["schema_version"] = draw(st.one_of(st.integers().filter(lambda v: v != SCHEMA_VERSION),
                                             st.sampled_from([None, "1", 1.0, True, [1]])))
    elif kind == "ragged":
        level = draw(st.sampled_from(["ctx", "batch", "k", "extra"]))
        c, b, _ = draw(st.sampled_from(LAT_CELLS))
        if level == "ctx":
            d["latency_ms"].pop(c)
        elif level == "batch":
            d["latency_ms"][c].pop(b)
        elif level == "k":
            d["latency_ms"][c][b].pop()
        else:
            d["latency_ms"][c][b].append(1.0)
    elif kind == "acceptance":
        i = draw(st.integers(0, 2))
        d["acceptance"][i] = draw(st.one_of(st.floats(min_value=1.0, exclude_min=True),
                                            st.floats(max_value=0.0, exclude_max=True),
                                            st.sampled_from([float("nan"), None, "0.5", True])))
    elif kind == "axis":
        name = draw(st.sampled_from(["batch_sizes", "ks", "context_lengths"]))
        ax = d[name]
        how = draw(st.sampled_from(["swap", "dup", "neg", "float"]))
        if how == "swap":
            ax[0], ax[1] = ax[1], ax[0]
        elif how == "dup":
            ax[1] = ax[0]
        elif how == "neg":
            ax[0] = -1
        else:
            ax[0] = ax[0] + 0.5
    else:
        path = draw(st.sampled_from([p for p in _paths(d) if p[0] not in ("meta", "created")]))
        parent = _get(d, path[:-1])
        old = parent[path[-1]]
        new = draw(st.sampled_from(["x", {"a": 1}, None, [], [[[]]]]).filter(lambda v: v != old and type(v) is not type(old)))
        if path[0] in ("acceptance_by_temperature", "catchup_ms") and len(path) == 1 and new is None:
            new = "x"  # null is a legal value there
        parent[path[-1]] = new
    return d


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(doc=invalid_mutation())
def test_any_invalid_mutation_rejected_on_load(tmp_path_factory, doc):
    path = tmp_path_factory.mktemp("m") / "p.json"
    path.write_text(json.dumps(doc))  # NaN/inf written as JSON NaN/Infinity tokens
    with pytest.raises(ValueError, match="p.json"):
        Profile.load(path)


@settings(max_examples=40, deadline=None)
@given(
    nb=st.integers(1, 5), nk=st.integers(1, 5), nc=st.integers(1, 3),
    seed=st.integers(0, 2**31 - 1),
)
def test_random_round_trip(tmp_path_factory, nb, nk, nc, seed):
    rng = np.random.default_rng(seed)
    bs = sorted(rng.choice(np.arange(1, 200), nb, replace=False).tolist())
    cs = sorted(rng.choice(np.arange(0, 5000), nc, replace=False).tolist())
    table = rng.uniform(0.01, 100.0, (nc, nb, nk + 1))
    acc = np.sort(rng.uniform(0, 1, nk))[::-1].tolist()
    p = Profile("gpu", bs, list(range(nk + 1)), table.tolist(), acc, context_lengths=cs)
    path = tmp_path_factory.mktemp("r") / "p.json"
    p.save(path)
    q = Profile.load(path)
    assert q.to_dict() == p.to_dict()
    for _ in range(5):
        b, c, k = rng.uniform(0, 250), rng.uniform(-10, 6000), int(rng.integers(0, nk + 1))
        v = q.itl_ms(b, k, c)
        assert math.isfinite(v) and table[..., k].min() <= v <= table[..., k].max()
