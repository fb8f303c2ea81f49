"""The emulator's RSA host key pool (tpulab/emulator/rsa_pool.py): keys made once per
machine, never two boots of one cloud with the same key, a damaged key made anew."""

from __future__ import annotations

import threading
from pathlib import Path

from cryptography.hazmat.primitives import serialization

from tpulab.emulator.hostkeys import new_host_keys
from tpulab.emulator.rsa_pool import POOL_SIZE, RSA_BITS, RsaKeyPool


def _public(key: object) -> bytes:
    return key.public_key().public_bytes(  # type: ignore[attr-defined,no-any-return]
        serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH
    )


def test_one_cloud_never_hands_out_a_key_twice_and_a_second_cloud_reuses_the_pool(
    tmp_path: Path,
) -> None:
    pool = tmp_path / "pool"
    first = RsaKeyPool(tmp_path / "cloud-a", pool)
    taken = [_public(first.take()) for _ in range(4)]
    assert len(set(taken)) == 4
    assert sorted(p.name for p in pool.iterdir()) == [f"{i:06d}.pem" for i in range(4)]
    # Another cloud on the same machine takes the same keys, in order, making none.
    again = [_public(RsaKeyPool(tmp_path / "cloud-b", pool).take()) for _ in range(1)]
    assert again == taken[:1]
    # The first cloud goes on where it was (its counter is in its state directory),
    # and a second pool object on that directory (another process) agrees.
    later = _public(RsaKeyPool(tmp_path / "cloud-a", pool).take())
    assert later not in taken
    assert (tmp_path / "cloud-a" / "host-keys.next").read_text() == "5\n"


def test_a_pooled_key_is_a_real_rsa_key_of_the_size_and_signs(tmp_path: Path) -> None:
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.asymmetric import padding

    key = RsaKeyPool(tmp_path / "cloud", tmp_path / "pool").take()
    reloaded = RsaKeyPool(tmp_path / "other", tmp_path / "pool").take()  # from the file
    assert key.key_size == reloaded.key_size == RSA_BITS
    signature = reloaded.sign(b"hello", padding.PKCS1v15(), hashes.SHA256())
    key.public_key().verify(signature, b"hello", padding.PKCS1v15(), hashes.SHA256())


def test_a_damaged_pool_key_is_made_anew_and_kept(tmp_path: Path) -> None:
    pool = tmp_path / "pool"
    original = _public(RsaKeyPool(tmp_path / "a", pool).take())
    path = pool / "000000.pem"
    data = bytearray(path.read_bytes())
    data[-40] ^= 0x01  # one bit of the key flipped: its checksum no longer matches
    path.write_bytes(bytes(data))
    remade = _public(RsaKeyPool(tmp_path / "b", pool).take())
    assert remade != original
    assert _public(RsaKeyPool(tmp_path / "c", pool).take()) == remade  # kept
    path.write_bytes(b"")  # emptied
    assert _public(RsaKeyPool(tmp_path / "d", pool).take()) not in (original, remade)


def test_an_unwritable_pool_still_gives_a_fresh_key(tmp_path: Path) -> None:
    blocked = tmp_path / "pool"
    blocked.write_text("a file where the pool's directory should be")
    pool = RsaKeyPool(tmp_path / "cloud", blocked)
    assert _public(pool.take()) != _public(pool.take())
    (tmp_path / "jammed" / "host-keys.next").mkdir(parents=True)  # a counter it cannot keep
    jammed = RsaKeyPool(tmp_path / "jammed", tmp_path / "pool")
    assert _public(jammed.take()) != _public(jammed.take())


def test_a_damaged_counter_starts_the_cloud_again_from_the_first_key(tmp_path: Path) -> None:
    pool = RsaKeyPool(tmp_path / "cloud", tmp_path / "pool")
    first = _public(pool.take())
    for damage in (b"\xff\xfe7\n", b"seven\n", b""):
        pool.counter.write_bytes(damage)
        assert _public(pool.take()) == first
        assert pool.counter.read_bytes() == b"1\n"


def test_boots_at_once_in_one_cloud_get_different_keys(tmp_path: Path) -> None:
    pool = RsaKeyPool(tmp_path / "cloud", tmp_path / "pool")
    found: list[bytes] = []
    lock = threading.Lock()

    def boot() -> None:
        keys = new_host_keys(pool)
        with lock:
            found.extend(k.b64.encode() for k in keys if k.key_type == "ssh-rsa")

    threads = [threading.Thread(target=boot) for _ in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(found) == len(set(found)) == 6
    # A cloud that starts later (a fresh state directory) makes no new keys for these.
    made = sorted(p.name for p in (tmp_path / "pool").iterdir())
    assert made == [f"{i:06d}.pem" for i in range(6)]


def test_a_cloud_that_has_booted_the_whole_pool_goes_round_it(tmp_path: Path) -> None:
    """The pool stays bounded however long a user's default cloud lives."""
    cloud = tmp_path / "cloud"
    pool = RsaKeyPool(cloud, tmp_path / "pool")
    first = _public(pool.take())
    (cloud / "host-keys.next").write_text(f"{POOL_SIZE}\n")  # POOL_SIZE boots later
    assert _public(pool.take()) == first
    assert len(list((tmp_path / "pool").iterdir())) == 1


def test_clouds_making_the_same_missing_key_at_once_agree_on_it(tmp_path: Path) -> None:
    """Two clouds (two processes, in the suite: two xdist workers) that both find key 0
    missing both make one; the first written is the key, and the other cloud gets it."""
    pool_dir = tmp_path / "pool"
    start = threading.Barrier(4)
    found: list[bytes] = []
    lock = threading.Lock()

    def first_boot(cloud: str) -> None:
        pool = RsaKeyPool(tmp_path / cloud, pool_dir)
        start.wait()
        key = _public(pool.take())
        with lock:
            found.append(key)

    threads = [threading.Thread(target=first_boot, args=(f"c{i}",)) for i in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    kept = _public(RsaKeyPool(tmp_path / "later", pool_dir).take())
    assert found == [kept] * 4
    assert [p.name for p in pool_dir.iterdir()] == ["000000.pem"]  # no temporary left
