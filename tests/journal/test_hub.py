"""The stream hub in-process, over a real FSM committed from another thread.

Fast checks of what the cluster tests then check end to end: subscribers
joining at any moment of a write burst get every batch after their index
once, in order, unsplit (the catch-up -> live hand-over is gapless); filters
and progress bookmarks; reset-required; a stalled subscriber is cut off with
a resume index while apply carries on.
"""

from __future__ import annotations

import asyncio
import random
import threading
from types import SimpleNamespace
from typing import Any

import pytest

from fsm import codec
from fsm import messages as m
from fsm.journal import Retention
from fsm.structs import ACLToken
from fsm.topics import full_records
from node.core.hub import Hub
from node.core.stream import parse_topics
from node.endpoints.events import parse_args
from node.spec.nomadjson import to_nomad
from node.wire.errors import RPCError
from node.wire.events import decode_batch, record_events, unfold, unpack
from tests.journal.support import Harness, job, node

DEADLINE = 60.0


class Writer(threading.Thread):
    """Plays the raft tick thread: applies entries, committing in random groups."""

    def __init__(self, h: Harness, count: int, seed: int = 1) -> None:
        super().__init__(daemon=True)
        self.h, self.count, self.rng = h, count, random.Random(seed)
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            for i in range(self.count):
                body = job(f"j{i % 50}", meta={"i": str(i)}) if i % 3 == 0 else node(f"n{i}")
                self.h.apply(body, commit=self.rng.random() < 0.3)
            self.h.commit()
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            self.error = exc


async def collect(hub: Hub, after: int, until: int, frames: list[Any] | None = None, **kw: Any) -> list[dict[str, Any]]:
    """Items (groups unfolded) until a progress notification reaches ``until``; ``frames`` gets the raw ones."""
    items = []
    gen = hub.subscribe(after, parse_topics(kw.pop("topics", None))[0], **kw)
    try:
        async with asyncio.timeout(DEADLINE):
            async for frame in gen:
                unfolded = unfold(frame)
                if len(unfolded) > 1 or "batches" in frame or "packed" in frame:
                    assert len(unfolded) > 1 and all("index" in b for b in unfolded)
                if frames is not None:
                    frames.append(frame)
                items.extend(unfolded)
                if frame.get("progress", -1) >= until:
                    return items
    finally:
        await gen.aclose()
    return items


def batches_of(items: list[dict[str, Any]]) -> list[tuple[int, list[Any]]]:
    return [(i["index"], i["events"] if "events" in i else unpack(i["raw"])) for i in items if "index" in i]


@pytest.mark.parametrize("group, encoding", [(1, "records"), (50, "records"), (256, "msgpack")])
def test_subscribers_joining_mid_burst_get_every_batch_once_in_order(group: int, encoding: str) -> None:
    h = Harness()

    async def main() -> None:
        hub = Hub(h.fsm, asyncio.get_running_loop())
        writer = Writer(h, 1500)
        rng = random.Random(7)
        tasks = []
        all_frames: list[list[Any]] = []
        writer.start()
        for _ in range(12):
            await asyncio.sleep(rng.random() * 0.05)
            start = rng.choice([0, h.fsm.applied_index // 2, max(0, h.fsm.applied_index - 3)])
            frames: list[Any] = []
            tasks.append(
                (start, asyncio.create_task(collect(hub, start, 1500, frames, heartbeat=0.2, group=group, encoding=encoding)))
            )
            all_frames.append(frames)
        results = [(start, await task) for start, task in tasks]
        await asyncio.get_running_loop().run_in_executor(None, writer.join)
        assert writer.error is None
        with h.fsm.read() as r:
            journal = list(r.journal_batches())
        assert journal[-1][0] == 1500
        if encoding == "records":  # decoded events carry every field of a job or eval
            journal = [(i, full_records(recs)) for i, recs in journal]
        for start, items in results:
            got = batches_of(items)
            assert got == [b for b in journal if b[0] > start], f"subscriber from {start} saw a different journal"
        assert hub.stats["overflows"] == 0
        assert hub.stats["fanned_batches"] > 0, "no subscriber reached the live tail during the burst"
        grouped = sum(1 for frames in all_frames for f in frames if "batches" in f or "packed" in f)
        assert (grouped > 0) == (group > 1)
        if encoding == "msgpack" and group > 1:
            assert any("packed" in f for frames in all_frames for f in frames), "no shared packed run was sent"

    try:
        asyncio.run(main())
    finally:
        h.close()


def test_filters_and_progress_bookmarks() -> None:
    h = Harness()
    h.apply(node("n1"))
    h.apply(job("web"))
    h.apply(job("api"))
    h.apply(node("n2"))

    async def main() -> None:
        hub = Hub(h.fsm, asyncio.get_running_loop())
        items = await collect(hub, 0, 4, topics=["Job:web", "Node"], heartbeat=0.1)
        assert [(i, [e[:3] for e in ev]) for i, ev in batches_of(items)] == [
            (1, [["Node", "NodeRegistration", "n1"]]),
            (2, [["Job", "JobRegistered", "web"]]),
            (4, [["Node", "NodeRegistration", "n2"]]),
        ]
        assert items[-1] == {"progress": 4}
        # Nothing matches for a while: heartbeats carry the position forward.
        items = await collect(hub, 4, 4, topics=["Deployment"], heartbeat=0.1)
        assert items == [{"progress": 4}]
        gen = hub.subscribe(4, parse_topics(["Deployment"])[0], heartbeat=0.1)
        assert await anext(gen) == {"progress": 4}  # caught up
        threading.Thread(target=h.apply, args=(node("n3"),)).start()
        async with asyncio.timeout(DEADLINE):
            while (item := await anext(gen)) != {"progress": 5}:
                assert "progress" in item  # the node batch is filtered out, never sent
        await gen.aclose()

    try:
        asyncio.run(main())
    finally:
        h.close()


def test_reset_required_names_the_oldest_index_and_never_jumps() -> None:
    h = Harness(retention=Retention(max_batches=5))
    for i in range(12):
        h.apply(node(f"n{i}"))

    async def main() -> None:
        hub = Hub(h.fsm, asyncio.get_running_loop())
        with h.fsm.read() as r:
            trimmed, (oldest, _) = r.journal_trimmed(), r.journal_bounds()
        assert (trimmed, oldest) == (7, 8)
        for start in (0, 3, 6):
            with pytest.raises(RPCError) as info:
                await collect(hub, start, 12)
            err = info.value
            assert err.code == "reset_required"
            assert err.details == {"requested_index": start, "oldest_index": 8}
        items = await collect(hub, 7, 12)
        assert [i for i, _ in batches_of(items)] == [8, 9, 10, 11, 12]

    try:
        asyncio.run(main())
    finally:
        h.close()


def test_stalled_subscriber_is_cut_off_with_a_resume_index_and_apply_goes_on() -> None:
    h = Harness()
    h.apply(node("n0"))

    async def main() -> None:
        hub = Hub(h.fsm, asyncio.get_running_loop())
        gen = hub.subscribe(0, parse_topics(None)[0], buffer=8, heartbeat=30)
        first = await anext(gen)
        assert first["index"] == 1
        assert await anext(gen) == {"progress": 1}  # live now; stop reading
        writer = Writer(h, 200)
        writer.start()
        await asyncio.get_running_loop().run_in_executor(None, writer.join)
        assert writer.error is None and h.fsm.applied_index == 201
        async with asyncio.timeout(DEADLINE):
            while hub.stats["overflows"] == 0:
                await asyncio.sleep(0.01)
        with pytest.raises(RPCError) as info:
            await anext(gen)
        err = info.value
        assert err.code == "unavailable" and err.details["reason"] == "slow_subscriber"
        assert err.details["resume_index"] == 1
        items = await collect(hub, err.details["resume_index"], 201)
        assert [i for i, _ in batches_of(items)] == list(range(2, 202))

    try:
        asyncio.run(main())
    finally:
        h.close()


@pytest.mark.parametrize(
    "args, message",
    [
        ({"index": -1}, "'index' must be an integer >= 0"),
        ({"index": "5"}, "'index' must be an integer >= 0"),
        ({"topics": "Job"}, "'topics' must be a list"),
        ({"topics": ["Jobs"]}, "unknown topic 'Jobs'"),
        ({"topics": ["Job:"]}, "empty key"),
        ({"heartbeat": 0}, "'heartbeat' must be a number"),
        ({"buffer": 0}, "'buffer' must be a number"),
        ({"group": 5000}, "'group' must be a number"),
        ({"encoding": "json"}, "'encoding' must be one of"),
    ],
)
def test_bad_arguments_are_one_line_errors(args: dict[str, Any], message: str) -> None:
    with pytest.raises(RPCError) as info:
        parse_args(args)
    assert info.value.code == "bad_request" and message in info.value.message


def test_topic_parsing() -> None:
    flt, explicit = parse_topics(["Job:web", "Node", "Job:api", "Node:n1"])
    assert flt.topics == {"Node"} and flt.keys == {("Job", "web"), ("Job", "api")} and explicit
    flt, explicit = parse_topics(["*"])
    assert flt.everything and not explicit
    assert parse_topics(["Allocation:*"])[0].topics == {"Allocation"}


def test_msgpack_encoding_passes_the_journal_bytes_through() -> None:
    h = Harness()
    h.apply(node("n1"))
    h.apply(job("web"))
    h.apply(job("api"))

    async def main() -> None:
        hub = Hub(h.fsm, asyncio.get_running_loop())
        with h.fsm.read() as r:
            raw = {i: r.txn.get(i.to_bytes(8, "big"), db=r.dbs["journal"]) for i in (1, 2, 3)}
        items = await collect(hub, 0, 3, encoding="msgpack")
        assert [(i["index"], i["raw"]) for i in items if "index" in i] == sorted(raw.items())
        items = await collect(hub, 0, 3, encoding="msgpack", topics=["Job:api"])
        [only] = [i for i in items if "index" in i]
        assert only["index"] == 3 and [r[:3] for r in unpack(only["raw"])] == [["Job", "JobRegistered", "api"]]

    try:
        asyncio.run(main())
    finally:
        h.close()


class _AclStub:
    """A server whose tokens may read but not manage (ACLs on, a read token)."""

    def __init__(self, h: Harness) -> None:
        self.fsm = h.fsm
        self.revoked = False

    async def authorize(self, ctx: Any, need: Any) -> None:
        from node.core.acl import Need

        if self.revoked or need is Need.MANAGEMENT:
            raise RPCError("permission_denied", "this call needs a management token")


def test_acl_tokens_only_for_management_and_a_revoked_token_ends_the_stream() -> None:
    from node.endpoints.events import event_stream

    h = Harness()
    h.apply(m.ACLTokenUpsert(tokens=[ACLToken(accessor_id="t1", secret_hash="0" * 64, type="client", policies=["read"])]))
    h.apply(node("n1"))

    async def main() -> None:
        stub = _AclStub(h)
        ctx = SimpleNamespace(loop=asyncio.get_running_loop())
        # Default topics: ACLToken quietly left out for a non-management token.
        gen = event_stream(stub, ctx, {"index": 0, "heartbeat": 0.1})  # type: ignore[arg-type]
        first = await anext(gen)
        assert first["index"] == 2 and first["events"][0][0] == "Node"
        assert await anext(gen) == {"progress": 2}
        # The token is revoked: the next heartbeat re-checks it and ends the stream.
        stub.revoked = True
        with pytest.raises(RPCError) as info:
            async with asyncio.timeout(DEADLINE):
                while True:
                    await anext(gen)
        assert info.value.code == "permission_denied"
        await gen.aclose()
        # Asking for ACLToken by name is refused outright.
        stub.revoked = False
        gen = event_stream(stub, ctx, {"index": 0, "topics": ["ACLToken"]})  # type: ignore[arg-type]
        with pytest.raises(RPCError) as info:
            await anext(gen)
        assert info.value.code == "permission_denied"

    try:
        asyncio.run(main())
    finally:
        h.close()


def test_a_subscriber_ahead_of_this_server_waits_for_it_instead_of_resetting() -> None:
    """A subscriber that moved here from a server further along (this one lags) just waits."""
    h = Harness()
    for i in range(3):
        h.apply(node(f"n{i}"))

    async def main() -> None:
        hub = Hub(h.fsm, asyncio.get_running_loop())
        # Someone else is live already, and someone is not: both cases of join.
        for others in (0, 1):
            gens = [hub.subscribe(h.index, parse_topics(None)[0], heartbeat=0.1) for _ in range(others)]
            for gen in gens:
                assert await anext(gen) == {"progress": h.index}
            ahead = h.index + 3
            items = asyncio.create_task(collect(hub, ahead, ahead + 2, heartbeat=0.1))
            async with asyncio.timeout(DEADLINE):
                while len(hub.live) < others + 1:  # it is waiting at the (future) tail
                    await asyncio.sleep(0.01)
            writer = threading.Thread(target=lambda: [h.apply(node(f"m{h.index}")) for _ in range(5)])
            writer.start()
            await asyncio.get_running_loop().run_in_executor(None, writer.join)
            got = [i for i, _ in batches_of(await items)]
            assert got == [ahead + 1, ahead + 2], got
            for gen in gens:
                await gen.aclose()
        assert hub.stats["resets"] == 0

    try:
        asyncio.run(main())
    finally:
        h.close()


def test_commits_wake_the_loop_only_while_someone_is_live() -> None:
    """With nobody at the tail a commit costs the loop nothing; a newcomer still gets every batch."""
    h = Harness()

    async def main() -> None:
        loop = asyncio.get_running_loop()
        hub = Hub(h.fsm, loop)
        calls = 0
        real = loop.call_soon_threadsafe

        def counting(*args: Any, **kw: Any) -> Any:
            nonlocal calls
            if threading.current_thread() is writer:  # the committing thread, as raft's tick thread
                calls += 1
            return real(*args, **kw)

        writer = Writer(h, 300)
        loop.call_soon_threadsafe = counting  # type: ignore[method-assign]
        writer.start()
        await loop.run_in_executor(None, writer.join)
        assert writer.error is None
        assert calls == 0, f"{calls} wake-ups for 300 commits with no subscriber"
        # A subscriber joining now (nothing woke the hub) still sees the whole tail, then live batches.
        start = h.index - 5
        items = asyncio.create_task(collect(hub, start, h.index + 20, heartbeat=0.1))
        async with asyncio.timeout(DEADLINE):
            while not hub.live:
                await asyncio.sleep(0.01)
        more = Writer(h, 20, seed=2)
        more.start()
        await loop.run_in_executor(None, more.join)
        got = [i for i, _ in batches_of(await items)]
        assert got == list(range(start + 1, h.index + 1))

    try:
        asyncio.run(main())
    finally:
        h.close()


def test_a_commit_below_the_tail_resets_live_subscribers() -> None:
    """The store went backwards (an older snapshot swapped in): live subscribers must reset, explicitly."""
    h = Harness()
    for i in range(10):
        h.apply(node(f"n{i}"))

    async def main() -> None:
        hub = Hub(h.fsm, asyncio.get_running_loop())
        gen = hub.subscribe(h.index, parse_topics(None)[0], heartbeat=0.1)
        assert await anext(gen) == {"progress": h.index}
        # The FSM's commit listener, as the tick thread calls it after a restore to index 4
        # followed at once by newer commits (the loop sees them in one wake-up).
        for index in (4, 5, h.index + 1):
            await asyncio.to_thread(hub._committed_from_thread, index)
        with pytest.raises(RPCError) as info:
            async with asyncio.timeout(DEADLINE):
                async for _ in gen:
                    pass
        assert info.value.code == "reset_required"
        assert info.value.details["oldest_index"] == 5
        assert hub.stats["resets"] == 1

    try:
        asyncio.run(main())
    finally:
        h.close()


def test_commits_the_pump_read_past_before_the_loop_took_them_in_are_no_reset() -> None:
    """The pump reads the store directly, so its tail may pass commits whose wake-up is still queued.

    Regression (seen in CI): those commits were taken for "the store went
    backwards" and every live subscriber got a false reset_required.
    """
    h = Harness()
    for i in range(5):
        h.apply(node(f"n{i}"))

    async def main() -> None:
        hub = Hub(h.fsm, asyncio.get_running_loop())
        gen = hub.subscribe(h.index, parse_topics(None)[0], heartbeat=0.1)
        assert await anext(gen) == {"progress": h.index}
        for i in range(5):  # committed with the loop busy: the wake-up waits in the queue
            h.apply(node(f"m{i}"))
        hub.tail = h.index  # ... while a fan-out round already read (and sent) them
        await asyncio.sleep(0)  # the queued wake-up runs
        async with asyncio.timeout(DEADLINE):
            item = await anext(gen)  # a heartbeat bookmark, not reset_required
        assert "progress" in item, item
        assert hub.stats["resets"] == 0
        await gen.aclose()

    try:
        asyncio.run(main())
    finally:
        h.close()


def test_subscribers_get_every_field_of_a_job_and_eval_the_journal_packs_without_defaults() -> None:
    """Jobs and evals are CompactRecords: the journal leaves their defaults out, events do not.

    A ``records`` subscriber (and the HTTP stream on top of it) gets each
    object's every field; a ``msgpack`` subscriber gets the journal's own
    bytes, which ``follow()`` (and so the CLI) decodes to the same records.
    """
    h = Harness()
    h.apply(job("web"))

    async def main() -> None:
        hub = Hub(h.fsm, asyncio.get_running_loop())
        with h.fsm.read() as r:
            stored_job, stored_eval = r.job("web"), r.eval("eval-web")
        [packed] = [i for i in await collect(hub, 0, 1, encoding="msgpack") if "index" in i]
        raw_records = {rec[0]: rec[3] for rec in unpack(packed["raw"])}
        assert "namespace" not in raw_records["Job"] and "status" not in raw_records["Evaluation"]
        [decoded] = [i for i in await collect(hub, 0, 1) if "index" in i]
        payloads = {rec[0]: rec[3] for rec in decoded["events"]}
        assert payloads["Job"] == codec.dump(stored_job)
        assert payloads["Evaluation"] == codec.dump(stored_eval)
        assert payloads["Job"]["namespace"] == "default" and payloads["Evaluation"]["status"] == "pending"
        assert decode_batch(packed["raw"]) == decoded["events"]  # what follow() yields from journal bytes
        events = {e["Topic"]: e["Payload"] for e in record_events(1, decode_batch(packed["raw"]))}
        assert events["Job"]["Job"] == to_nomad(stored_job)
        assert events["Evaluation"]["Evaluation"]["Status"] == "pending"

    try:
        asyncio.run(main())
    finally:
        h.close()
