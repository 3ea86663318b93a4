"""Nomad's jobspec blocks (job, group, task, resources and device, constraint, meta, update, migrate, reschedule) as API JSON.

The half of HCL-to-JSON conversion that knows Nomad: which blocks and
attributes Caravan models and their API names (what ``nomad job run -output``
prints). Everything else in a block is dropped with a warning by
``HCLValues.body``. Two of Nomad's canonicalisations happen here because the
JSON has no place for what they merge away: task-level constraints join their
group's, and job-level update/migrate/reschedule blocks become every group's
defaults (a partial reschedule block completed from Nomad's defaults for the
job type, via ``node.spec.defaults``).
"""

from __future__ import annotations

from typing import Any

from node.spec.defaults import with_group_default
from node.spec.hcl_text import BLOCK_MARK, Path, block_list
from node.spec.hcl_values import BlockHandler, HCLValues
from node.spec.reschedule import merge_policy

# The constraint attributes that name both the operand and the right-hand target.
_SHORTHAND_RTARGET = ("version", "semver", "regexp", "set_contains", "set_contains_any", "set_contains_all")


class NomadBlocks(HCLValues):
    """One HCL file's job block turned into Nomad's API job JSON; warnings collect in ``self.warnings``."""

    # -- job ------------------------------------------------------------------------------
    def job(self, labels: list[str], body: dict[str, Any], path: Path) -> dict[str, Any]:
        """The ``job "ID" { ... }`` block as the API job (without the ``{"Job": ...}`` wrapper)."""
        (job_id,) = self.labels(path, "job", labels, 1)
        job: dict[str, Any] = {"ID": job_id, "Name": job_id}
        group_defaults: dict[str, dict[str, Any]] = {}
        groups: list[dict[str, Any]] = []
        self.body(
            body,
            path,
            f'job "{job_id}"',
            {
                "name": ("Name", self.string),
                "namespace": ("Namespace", self.string),
                "region": ("Region", self.string),
                "type": ("Type", self.string),
                "priority": ("Priority", self.integer),
                "datacenters": ("Datacenters", self.strings),
                # Caravan's, for queues (not Nomad's): the job's queue and priority class by name.
                "queue": ("Queue", self.string),
                "priority_class": ("PriorityClass", self.string),
            },
            self._job_blocks(job, group_defaults, groups),
            job,
        )
        job.pop("Region", None)  # one region: accepted, not modelled
        job["TaskGroups"] = _with_job_defaults(groups, group_defaults, job.get("Type", "service"))
        return job

    def _job_blocks(
        self, job: dict[str, Any], group_defaults: dict[str, dict[str, Any]], groups: list[dict[str, Any]]
    ) -> dict[str, BlockHandler]:
        """The handlers of a job body's blocks: groups and lone tasks into ``groups``, the rest into ``job``
        or (update, migrate, reschedule) into ``group_defaults``."""

        def task(lab: list[str], inner: dict[str, Any], sub: Path) -> None:
            # A task directly under the job: Nomad wraps it in a group of the same name.
            t = self.task(lab, inner, sub)
            g: dict[str, Any] = {"Name": t["Name"], "Count": 1, "Tasks": [t]}
            if t.get("Constraints"):
                g["Constraints"] = t.pop("Constraints")
            groups.append(g)

        return {
            "group": lambda lab, inner, sub: groups.append(self.group(lab, inner, sub)),
            "task": task,
            "constraint": lambda lab, inner, sub: job.setdefault("Constraints", []).append(
                self.constraint(lab, inner, sub)
            ),
            "meta": lambda lab, inner, sub: job.setdefault("Meta", {}).update(self.meta(lab, inner, sub)),
            "update": lambda lab, inner, sub: group_defaults.__setitem__("Update", self.update(lab, inner, sub)),
            "migrate": lambda lab, inner, sub: group_defaults.__setitem__("Migrate", self.migrate(lab, inner, sub)),
            "reschedule": lambda lab, inner, sub: group_defaults.__setitem__(
                "ReschedulePolicy", self.reschedule(lab, inner, sub)
            ),
        }

    def group(self, labels: list[str], body: dict[str, Any], path: Path) -> dict[str, Any]:
        """A ``group`` block; its tasks' constraints move up to it (Nomad checks them for the whole group)."""
        (name,) = self.labels(path, "group", labels, 1)
        group: dict[str, Any] = {"Name": name}
        tasks: list[dict[str, Any]] = []
        self.body(
            body,
            path,
            f'group "{name}"',
            {"count": ("Count", self.integer)},
            {
                "task": lambda lab, inner, sub: tasks.append(self.task(lab, inner, sub)),
                "constraint": lambda lab, inner, sub: group.setdefault("Constraints", []).append(
                    self.constraint(lab, inner, sub)
                ),
                "meta": lambda lab, inner, sub: group.setdefault("Meta", {}).update(self.meta(lab, inner, sub)),
                "update": lambda lab, inner, sub: group.__setitem__("Update", self.update(lab, inner, sub)),
                "migrate": lambda lab, inner, sub: group.__setitem__("Migrate", self.migrate(lab, inner, sub)),
                "reschedule": lambda lab, inner, sub: group.__setitem__(
                    "ReschedulePolicy", self.reschedule(lab, inner, sub)
                ),
            },
            group,
        )
        group.setdefault("Count", 1)
        for t in tasks:
            moved = t.pop("Constraints", [])
            if moved:
                group.setdefault("Constraints", []).extend(moved)
        group["Tasks"] = tasks
        return group

    def task(self, labels: list[str], body: dict[str, Any], path: Path) -> dict[str, Any]:
        """A ``task`` block (its constraints are left for the group to take)."""
        (name,) = self.labels(path, "task", labels, 1)
        task: dict[str, Any] = {"Name": name}
        self.body(
            body,
            path,
            f'task "{name}"',
            {"driver": ("Driver", self.string)},
            {
                "config": lambda lab, inner, sub: task.__setitem__("Config", self.config(inner)),
                "resources": lambda lab, inner, sub: task.__setitem__("Resources", self.resources(lab, inner, sub)),
                "meta": lambda lab, inner, sub: task.setdefault("Meta", {}).update(self.meta(lab, inner, sub)),
                "constraint": lambda lab, inner, sub: task.setdefault("Constraints", []).append(
                    self.constraint(lab, inner, sub)
                ),
            },
            task,
        )
        return task

    def config(self, body: dict[str, Any]) -> dict[str, Any]:
        """A driver's free-form config: attributes as values, nested blocks as lists of maps."""
        out: dict[str, Any] = {}
        for name, raw in body.items():
            if name == BLOCK_MARK:
                continue
            found = block_list(raw)
            if found is None:
                out[name] = self.value(raw)
                continue
            items = out.setdefault(name, [])
            for labels, inner in found:
                value = self.config(inner)
                for label in reversed(labels):
                    value = {label: value}
                items.append(value)
        return out

    def meta(self, labels: list[str], body: dict[str, Any], path: Path) -> dict[str, str]:
        """A ``meta`` block: its attributes as a map of strings."""
        self.labels(path, "meta", labels, 0)
        return self.string_map(path, "meta", {k: v for k, v in body.items() if k != BLOCK_MARK})

    def constraint(self, labels: list[str], body: dict[str, Any], path: Path) -> dict[str, Any]:
        """Nomad's constraint block, shorthands (version, regexp, distinct_hosts, ...) included."""
        self.labels(path, "constraint", labels, 0)
        out: dict[str, Any] = {"LTarget": "", "RTarget": "", "Operand": "="}
        for name, raw in body.items():
            if name == BLOCK_MARK:
                continue
            if name == "attribute":
                out["LTarget"] = self.string(path, name, raw)
            elif name == "value":
                out["RTarget"] = self.string(path, name, raw)
            elif name in ("operator", "operand"):
                out["Operand"] = self.string(path, name, raw)
            elif name in _SHORTHAND_RTARGET:
                out["Operand"], out["RTarget"] = name, self.string(path, name, raw)
            elif name == "distinct_hosts":
                if self.boolean(path, name, raw):
                    out["Operand"] = "distinct_hosts"
            elif name == "distinct_property":
                out["Operand"], out["LTarget"] = "distinct_property", self.string(path, name, raw)
            else:
                self.ignore_attr(path, name, "constraint")
        return out

    # -- blocks of attributes only -----------------------------------------------------------
    def resources(self, labels: list[str], body: dict[str, Any], path: Path) -> dict[str, Any]:
        """A ``resources`` block (cpu in MHz, memory and disk in MB) and its ``device "NAME"`` blocks,
        as Nomad's API Resources with ``Devices``: a list of RequestedDevice."""
        self.labels(path, "resources", labels, 0)
        out: dict[str, Any] = {}
        attrs = {"cpu": ("CPU", self.integer), "memory": ("MemoryMB", self.integer), "disk": ("DiskMB", self.integer)}
        blocks: dict[str, BlockHandler] = {
            "device": lambda lab, inner, sub: out.setdefault("Devices", []).append(self.device(lab, inner, sub)),
        }
        self.body(body, path, "resources", attrs, blocks, out)
        return out

    def device(self, labels: list[str], body: dict[str, Any], path: Path) -> dict[str, Any]:
        """A ``device "nvidia/gpu" { count = 2 }`` block: Nomad's RequestedDevice (count 1 when not given).

        Its constraint and affinity blocks are not modelled: they are dropped with a warning.
        """
        (name,) = self.labels(path, "device", labels, 1)
        out: dict[str, Any] = {"Name": name, "Count": 1}
        self.body(body, path, f'device "{name}"', {"count": ("Count", self.integer)}, {}, out)
        return out

    def update(self, labels: list[str], body: dict[str, Any], path: Path) -> dict[str, Any]:
        """An ``update`` block (durations in nanoseconds)."""
        return self.flat("update", labels, body, path, {
            "max_parallel": ("MaxParallel", self.integer),
            "min_healthy_time": ("MinHealthyTime", self.duration),
            "healthy_deadline": ("HealthyDeadline", self.duration),
            "progress_deadline": ("ProgressDeadline", self.duration),
            "auto_revert": ("AutoRevert", self.boolean),
            "canary": ("Canary", self.integer),
            "auto_promote": ("AutoPromote", self.boolean),
        })

    def migrate(self, labels: list[str], body: dict[str, Any], path: Path) -> dict[str, Any]:
        """A ``migrate`` block (durations in nanoseconds)."""
        return self.flat("migrate", labels, body, path, {
            "max_parallel": ("MaxParallel", self.integer),
            "health_check": ("HealthCheck", self.string),
            "min_healthy_time": ("MinHealthyTime", self.duration),
            "healthy_deadline": ("HealthyDeadline", self.duration),
        })

    def reschedule(self, labels: list[str], body: dict[str, Any], path: Path) -> dict[str, Any]:
        """A ``reschedule`` block as the API's ReschedulePolicy (durations in nanoseconds)."""
        return self.flat("reschedule", labels, body, path, {
            "attempts": ("Attempts", self.integer),
            "interval": ("Interval", self.duration),
            "delay": ("Delay", self.duration),
            "delay_function": ("DelayFunction", self.string),
            "max_delay": ("MaxDelay", self.duration),
            "unlimited": ("Unlimited", self.boolean),
        })


def _with_job_defaults(
    groups: list[dict[str, Any]], group_defaults: dict[str, dict[str, Any]], job_type: str
) -> list[dict[str, Any]]:
    """Each group with the job-level blocks as defaults under its own, field by field, as Nomad's
    canonicalisation does; a reschedule block (the group's or the job's) is merged over the type's
    defaults by ``merge_policy``, the one merge the JSON path uses too."""
    out = []
    job_reschedule = group_defaults.get("ReschedulePolicy")
    for group in groups:
        for block, block_defaults in group_defaults.items():
            if block != "ReschedulePolicy":
                group = with_group_default(group, block, block_defaults)
        if job_reschedule is not None or "ReschedulePolicy" in group:
            merged = merge_policy(job_type, job_reschedule, group.get("ReschedulePolicy"))
            group = group if merged is None else {**group, "ReschedulePolicy": merged}
        out.append(group)
    return out
