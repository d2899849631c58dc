"""Multihot layouts: where each categorical feature of an observation lands in the output."""
from dataclasses import dataclass, field

from ._ffi import ffi
from .errors import invalid

MAX_FEATURES = 64


@dataclass(frozen=True)
class MultihotLayout:
    """A height x width map of nfeat = len(slots) byte features a tile, starting at obs_offset:
    byte obs_offset + (h*width + w)*nfeat + f of value v < slots[f] sets channel
    offsets[f] + v of the (channels, height, width) output.  offsets default to the slots laid
    side by side, channels to their sum."""

    height: int
    width: int
    slots: tuple
    offsets: tuple = None
    obs_offset: int = 0
    channels: int = None
    _c: object = field(default=None, init=False, repr=False, compare=False)

    def __post_init__(self):
        slots = tuple(int(s) for s in self.slots)
        if not 1 <= len(slots) <= MAX_FEATURES:
            raise invalid(f"multihot layout: {len(slots)} features, must be 1..{MAX_FEATURES}")
        offsets = self.offsets
        if offsets is None:
            acc, offsets = 0, []
            for s in slots:
                offsets.append(acc)
                acc += s
        offsets = tuple(int(o) for o in offsets)
        if len(offsets) != len(slots):
            raise invalid(f"multihot layout: {len(offsets)} offsets for {len(slots)} slots")
        channels = self.channels
        if channels is None:
            channels = max(o + s for o, s in zip(offsets, slots))
        object.__setattr__(self, "slots", slots)
        object.__setattr__(self, "offsets", offsets)
        object.__setattr__(self, "channels", int(channels))
        c = ffi.new("gpucd_multihot_layout *")
        c.height, c.width, c.nfeat = int(self.height), int(self.width), len(slots)
        c.obs_offset, c.channels = int(self.obs_offset), int(channels)
        c.slots[0:len(slots)] = slots
        c.offsets[0:len(slots)] = offsets
        object.__setattr__(self, "_c", c)

    @property
    def nfeat(self):
        return len(self.slots)

    @property
    def obs_bytes(self):
        """The least observation length the layout reads."""
        return self.obs_offset + self.height * self.width * self.nfeat


# The daemon's preset (layout=None in multihot_encode): the NMMO3 map of an observation.
NMMO3 = MultihotLayout(height=11, width=15, slots=(4, 4, 17, 5, 3, 5, 5, 5, 7, 4))
