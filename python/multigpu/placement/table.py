"""Table output: a placement report as rows, and as the text it prints."""

from multigpu.placement import traffic


def format_bytes(n):
    """Bytes as text in the largest binary unit below 1024: `"1.3 KiB"`."""
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"


def text_table(header, rows, left=1):
    """Rows of strings as aligned text: the first `left` columns left."""
    lines = [tuple(header)] + [tuple(r) for r in rows]
    widths = [max(len(line[i]) for line in lines) for i in range(len(header))]
    text = [
        "  ".join(
            cell.ljust(w) if i < left else cell.rjust(w)
            for i, (cell, w) in enumerate(zip(line, widths))
        )
        for line in lines
    ]
    text.insert(1, "  ".join("-" * w for w in widths))
    return text


class PlacementReport(list):
    """The rows of `placement_report` (a list of dicts), with its notes.

    Attributes:
        notes: Sentences explaining the columns and what was observed.
        transfers: The step's `multigpu.placement.traffic.Transfer`s (tensors
            that crossed from one device to another), or None without a
            batch.
        gradient_bytes: Bytes of the model's trainable weights (one copy).
        replicas: Devices that ran ops in the step (the `n` of the bound).
        ring_bound_bytes: Bytes each of `replicas` devices sends in a ring
            all-reduce of `gradient_bytes`: `2 (n - 1) / n x gradient_bytes`.
        collectives: On the JAX backend, the compiled step's collectives,
            one dict each (`name`, `op` such as `"all-reduce"`, `bytes`
            each device puts in, `devices` taking part); None on
            TensorFlow or without a batch.
        batch_rows: On the JAX backend, the rows of the batch the step was
            compiled for; None on TensorFlow or without a batch.
    """

    def __init__(self, rows, notes, transfers=None, gradient_bytes=0,
                 replicas=1, collectives=None, batch_rows=None):
        super().__init__(rows)
        self.notes = list(notes)
        self.transfers = transfers
        self.gradient_bytes = gradient_bytes
        self.replicas = replicas
        self.collectives = collectives
        self.batch_rows = batch_rows
        self.ring_bound_bytes = traffic.ring_allreduce_bytes(
            gradient_bytes, replicas)

    def transfer_rows(self):
        """Bytes per pair of devices and kind of traffic, one dict per pair.

        Returns:
            A list of dicts with keys `source`, `destination`, one key per
            kind of `multigpu.placement.traffic.KINDS` (bytes) and `total`.
        """
        pairs = {}
        for (source, destination, kind), nbytes in sorted(
                traffic.bytes_by_pair(self.transfers or []).items()):
            row = pairs.setdefault((source, destination), dict(
                {"source": source, "destination": destination},
                **dict.fromkeys(traffic.KINDS, 0)))
            row[kind] += nbytes
        for row in pairs.values():
            row["total"] = sum(row[k] for k in traffic.KINDS)
        return list(pairs.values())

    def table(self):
        """The report as the text tables `placement_report` prints."""
        def show(value, formatter):
            return "-" if value is None else formatter(value)

        # Columns of the JAX backend's rows only (see `placement_report`).
        extra = [key for key in ("rows", "collectives")
                 if any(key in row for row in self)]
        text = text_table(
            ("device", "variables", "variable bytes", "ops", "time share",
             "sent", "received", *extra),
            [(row["device"], str(row["variables"]),
              format_bytes(row["variable_bytes"]),
              show(row["ops"], str),
              show(row["time_share"], lambda v: f"{100 * v:.1f}%"),
              show(row["sent_bytes"], format_bytes),
              show(row["received_bytes"], format_bytes),
              *(show(row.get(key), str) for key in extra))
             for row in self],
        )
        if self.transfers is not None:
            pairs = self.transfer_rows()
            text.append("")
            if pairs:
                kinds = [k for k in traffic.KINDS
                         if any(p[k] for p in pairs)]
                text += text_table(
                    ["from", "to"] + kinds + ["total"],
                    [[p["source"], p["destination"]]
                     + [format_bytes(p[k]) for k in kinds]
                     + [format_bytes(p["total"])] for p in pairs],
                    left=2,
                )
            else:
                text.append("no tensor crossed a device boundary")
            text.append(self.bound_line())
        return "\n".join(text + [f"* {note}" for note in self.notes])

    def bound_line(self):
        """One sentence: the busiest device's traffic against the bound."""
        busiest = max(
            (max(r["sent_bytes"] or 0, r["received_bytes"] or 0)
             for r in self), default=0)
        return (
            f"busiest device moves {format_bytes(busiest)} per step; ring "
            f"all-reduce bound for {format_bytes(self.gradient_bytes)} of "
            f"gradients on {self.replicas} device(s): 2(n-1)/n x gradients "
            f"= {format_bytes(self.ring_bound_bytes)} per device"
        )

    def __str__(self):
        return self.table()
