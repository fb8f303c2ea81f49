"""What each emulated zone offers: the catalog's zone table (tpulab.catalog.ZONES).

The table follows Google's "TPU regions and zones" page so that zone mistakes surface
offline the way they would online: asking a zone for a type it does not host is the
API's "invalid AcceleratorType" error, not a stockout. It lives in the catalog, a leaf
the emulator may import, so that `--zone auto` and the emulator read one table.
"""

from __future__ import annotations

from tpulab.catalog import ACCELERATOR_SIZES, ZONES, Zone, accelerator_family

__all__ = ["ACCELERATOR_SIZES", "ZONES", "Zone", "accelerator_family"]
