"""fsm.structs.Resources: the one resource arithmetic the scheduler, the usage cache and the plan applier share.

Properties, not examples: whatever the numbers (negative totals too, which a
running total passes through while stops are taken off before placements),
adding then subtracting gives back what was there, a sum is the per-field sum,
and ``exhausted``/``fits``/``utilization`` agree with the per-dimension
comparison the scheduler used to write out by hand.
"""

from __future__ import annotations

import statistics

from hypothesis import given, settings
from hypothesis import strategies as st

from fsm import codec
from fsm.structs import Resources

amounts = st.integers(-(2**40), 2**40)
sizes = st.integers(0, 2**20)
resources = st.builds(Resources, cpu=amounts, memory_mb=amounts, disk_mb=amounts)
asks = st.builds(Resources, cpu=sizes, memory_mb=sizes, disk_mb=sizes)


def dims(r: Resources) -> tuple[int, int, int]:
    return (r.cpu, r.memory_mb, r.disk_mb)


@settings(max_examples=300, deadline=None)
@given(a=resources, b=resources)
def test_add_then_subtract_is_identity_and_subtract_then_add_too(a: Resources, b: Resources) -> None:
    before = dims(a)
    a.add(b)
    assert dims(a) == tuple(x + y for x, y in zip(before, dims(b), strict=True))
    a.subtract(b)
    assert dims(a) == before
    a.subtract(b)
    a.add(b)
    assert dims(a) == before


@settings(max_examples=200, deadline=None)
@given(a=resources, b=resources, c=resources)
def test_add_is_commutative_and_associative(a: Resources, b: Resources, c: Resources) -> None:
    ab, ba = a.copy(), b.copy()
    ab.add(b)
    ba.add(a)
    assert ab == ba
    left = a.copy()
    left.add(b)
    left.add(c)
    bc = b.copy()
    bc.add(c)
    right = a.copy()
    right.add(bc)
    assert left == right


@settings(max_examples=200, deadline=None)
@given(parts=st.lists(resources, max_size=8))
def test_total_is_the_per_field_sum_and_leaves_its_parts_alone(parts: list[Resources]) -> None:
    kept = [dims(p) for p in parts]
    total = Resources.total(parts)
    assert dims(total) == tuple(sum(p[i] for p in kept) for i in range(3))
    assert [dims(p) for p in parts] == kept
    assert all(total is not p for p in parts)


@given(a=resources)
def test_copy_is_equal_and_independent_and_zero_is_zero(a: Resources) -> None:
    b = a.copy()
    assert b == a and b is not a
    b.add(Resources(cpu=1, memory_mb=1, disk_mb=1))
    assert b != a
    zero = Resources.zero()
    assert dims(zero) == (0, 0, 0)
    zero.add(a)
    assert zero == a
    assert dims(Resources.zero()) == (0, 0, 0), "zero() hands out a new record each time"


DIMENSIONS = (("cpu", "cpu"), ("memory", "memory_mb"), ("disk", "disk_mb"))  # (name, field), in checking order


def by_hand(capacity: Resources, used: Resources, ask: Resources) -> str | None:
    """The per-dimension comparison the scheduler and the plan applier spelled out, as a table:
    over capacity in a dimension, except disk when the ask asks for none."""
    for name, attr in DIMENSIONS:
        over = getattr(used, attr) + getattr(ask, attr) > getattr(capacity, attr)
        if over and (name != "disk" or ask.disk_mb > 0):
            return name
    return None


@settings(max_examples=500, deadline=None)
@given(capacity=asks, used=asks, ask=asks)
def test_exhausted_and_fits_agree_with_the_per_dimension_comparison(
    capacity: Resources, used: Resources, ask: Resources
) -> None:
    want = by_hand(capacity, used, ask)
    assert ask.exhausted(capacity, used) == want
    assert ask.fits(capacity, used) is (want is None)
    # Nothing in use is the same as a zero record, and as the total asked on an empty node.
    assert ask.exhausted(capacity) == ask.exhausted(capacity, Resources.zero())
    together = used.copy()
    together.add(ask)
    if ask.disk_mb > 0 or together.disk_mb <= capacity.disk_mb:
        assert together.exhausted(capacity) == want
    assert dims(capacity) == dims(capacity.copy())  # nothing is changed by asking


@settings(max_examples=300, deadline=None)
@given(capacity=asks, used=asks, freed=asks, ask=asks)
def test_an_ask_that_fits_still_fits_once_something_is_freed(
    capacity: Resources, used: Resources, freed: Resources, ask: Resources
) -> None:
    """Freeing resources (a stop taken off before placements) never makes a fitting ask stop fitting."""
    if ask.fits(capacity, used):
        less = used.copy()
        less.subtract(freed)
        assert ask.fits(capacity, less)
        assert ask.fits(capacity)


@settings(max_examples=300, deadline=None)
@given(capacity=asks, used=asks, ask=asks)
def test_utilization_is_the_mean_cpu_and_memory_fraction_capped_at_one(
    capacity: Resources, used: Resources, ask: Resources
) -> None:
    fractions = [
        (getattr(used, attr) + getattr(ask, attr)) / getattr(capacity, attr)
        for attr in ("cpu", "memory_mb")
        if getattr(capacity, attr) > 0
    ]
    want = min(1.0, statistics.fmean(fractions)) if fractions else 0.0
    assert ask.utilization(capacity, used) == want
    assert 0.0 <= want <= 1.0
    assert ask.utilization(capacity) == ask.utilization(capacity, Resources.zero())


@given(a=resources)
def test_the_methods_add_no_fields_to_the_stored_record(a: Resources) -> None:
    """Resources is stored and replicated: the arithmetic must not change what it packs to."""
    data = codec.encode(a)
    assert codec.unpack(data) == {"cpu": a.cpu, "memory_mb": a.memory_mb, "disk_mb": a.disk_mb, "devices": a.devices}
    assert codec.load(Resources, data) == a
