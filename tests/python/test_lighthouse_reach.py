"""A lighthouse far away or gone: a learner registers over a link with a
long round trip, and one whose lighthouse is gone at the end still shuts
down cleanly (the goodbye it cannot deliver is logged, not raised).
mend.Learner over numpy arrays; the far link is a TCP relay on loopback that
holds every chunk for the link's one-way delay."""
import socket
import threading
import time

import pytest

np = pytest.importorskip("numpy")

import mend  # noqa: E402

TOKEN = "lighthouse-reach-test-token-0123456789"


class DelayLink:
    """Relays TCP connections from 127.0.0.1:<port> to `target`, each chunk
    delivered `delay` seconds after it was read, in both directions: a link
    with a round trip of 2 x delay (its bandwidth is loopback's)."""

    def __init__(self, target, delay):
        self.target, self.delay = target, delay
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.address = f"127.0.0.1:{self.listener.getsockname()[1]}"
        self.closing = threading.Event()
        self.sockets = [self.listener]
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while not self.closing.is_set():
            try:
                near, _ = self.listener.accept()
            except OSError:
                return
            self.sockets.append(near)
            threading.Thread(target=self._connect, args=(near,), daemon=True).start()

    def _connect(self, near):
        # The far end answers the connect after a round trip (loopback's own
        # connect has already told the near end it is up).
        time.sleep(2 * self.delay)  # (the link's latency, not a synchronisation)
        host, port = self.target.rsplit(":", 1)
        try:
            far = socket.create_connection((host, int(port)), timeout=10)
        except OSError:
            near.close()
            return
        self.sockets.append(far)
        for source, sink in ((near, far), (far, near)):
            self._pipe(source, sink)

    def _pipe(self, source, sink):
        held = []  # (when to deliver, bytes); None: the source closed
        ready = threading.Condition()

        def read():
            while True:
                try:
                    data = source.recv(65536)
                except OSError:
                    data = b""
                with ready:
                    held.append((time.monotonic() + self.delay, data))
                    ready.notify()
                if not data:
                    return

        def deliver():
            while True:
                with ready:
                    ready.wait_for(lambda: held)
                    due, data = held.pop(0)
                wait = due - time.monotonic()
                if wait > 0:
                    time.sleep(wait)  # (the link's latency, not a synchronisation)
                try:
                    if not data:
                        sink.shutdown(socket.SHUT_WR)
                        return
                    sink.sendall(data)
                except OSError:
                    return

        threading.Thread(target=read, daemon=True).start()
        threading.Thread(target=deliver, daemon=True).start()

    def close(self):
        self.closing.set()
        for s in self.sockets:
            try:
                s.close()
            except OSError:
                pass


def lighthouse_config(**keys):
    return mend.MendConfig(bind="127.0.0.1:0", http="", heartbeat_ms=200, heartbeat_timeout_ms=5000,
                           log_level="warn", **keys)


def test_a_learner_registers_over_a_link_with_a_long_round_trip():
    # 0.4 s each way (a far link, or a loaded one): the connect and gRPC's
    # HTTP/2 handshake take 1.6 s. The lighthouse channel gave each connect
    # attempt 0.1 to 1.2 s before, and never registered.
    lighthouse = mend.Lighthouse(lighthouse_config(quorum_min_learners=1), token=TOKEN)
    link = DelayLink(lighthouse.address, 0.4)
    try:
        config = mend.MendConfig(lighthouse=link.address, quorum_min_learners=1, sync_period_steps=2,
                                 concurrent_outer_step=False, lighthouse_wait_ms=30000, heartbeat_ms=200,
                                 heartbeat_timeout_ms=5000, rpc_timeout_ms=20000, log_level="warn")
        params = [np.ones(16, dtype=np.float32)]
        learner = mend.Learner(config, [("w", params[0])], "far-learner", token=TOKEN)
        for _ in range(2):
            params[0] -= np.float32(0.1)
            learner.step(8)
        stats = learner.stats()
        learner.shutdown()
        assert stats["steps"] == 2 and stats["rounds"] == 1 and stats["failed_rounds"] == 0
    finally:
        link.close()
        lighthouse.shutdown()


def test_a_learner_whose_lighthouse_is_gone_at_the_end_shuts_down_without_raising():
    lighthouse = mend.Lighthouse(lighthouse_config(quorum_min_learners=1), token=TOKEN)
    config = mend.MendConfig(lighthouse=lighthouse.address, quorum_min_learners=1, sync_period_steps=4,
                             concurrent_outer_step=False, heartbeat_ms=200, heartbeat_timeout_ms=5000,
                             quorum_timeout_ms=5000, log_level="error")
    params = [np.ones(16, dtype=np.float32)]
    learner = mend.Learner(config, [("w", params[0])], "orphan-learner", token=TOKEN)
    for _ in range(5):  # a round at step 4, none in flight at the end
        params[0] -= np.float32(0.1)
        learner.step(8)
    lighthouse.shutdown()
    learner.shutdown()  # (raised UnavailableError from its goodbye)
    stats = learner.stats()
    assert stats["rounds"] == 1 and stats["steps"] == 5
    assert np.all(np.isfinite(params[0]))


def test_a_synchronous_learner_left_alone_trains_on_without_waiting_out_its_quorum_timeout():
    # Quorum of 2. b leaves after two rounds; a's later boundaries cannot
    # form a round. Its joins end a heartbeat timeout after they began
    # (the lighthouse says why), not at quorum_timeout_ms (10 minutes here:
    # before, a waited that long at every boundary).
    lighthouse = mend.Lighthouse(lighthouse_config(quorum_min_learners=2), token=TOKEN)
    config = mend.MendConfig(lighthouse=lighthouse.address, quorum_min_learners=2, sync_period_steps=2,
                             concurrent_outer_step=False, heartbeat_ms=100, heartbeat_timeout_ms=1000,
                             quorum_timeout_ms=600000, log_level="error")
    params = {name: [np.ones(16, dtype=np.float32)] for name in ("a", "b")}
    learners = {name: mend.Learner(config, [("w", params[name][0])], f"alone-{name}", token=TOKEN)
                for name in ("a", "b")}
    stats, errors = {}, []

    def train(name, steps):
        try:
            for _ in range(steps):
                params[name][0] -= np.float32(0.1)
                learners[name].step(8)
            stats[name] = learners[name].stats()
            learners[name].shutdown()
        except Exception as error:  # noqa: BLE001 (reported below)
            errors.append(error)

    threads = [threading.Thread(target=train, args=("a", 10)), threading.Thread(target=train, args=("b", 4))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    alive = [thread.is_alive() for thread in threads]
    if any(alive):
        for learner in learners.values():
            learner.interrupt()
    lighthouse.shutdown()
    assert not any(alive), "a learner left alone waited out quorum_timeout_ms at a boundary"
    assert not errors, errors
    assert stats["b"]["rounds"] == 2
    assert stats["a"]["rounds"] == 2 and stats["a"]["failed_rounds"] == 3 and stats["a"]["steps"] == 10


def test_rounds_failing_in_a_row_are_logged_at_the_1st_2nd_4th_8th_and_so_on(capfd):
    # The lighthouse is gone after the first round: every later boundary's
    # join fails (at once, once it has been lost for longer than the quorum
    # timeout). A warning at each of 30 boundaries would bury the log.
    lighthouse = mend.Lighthouse(lighthouse_config(quorum_min_learners=1), token=TOKEN)
    config = mend.MendConfig(lighthouse=lighthouse.address, quorum_min_learners=1, sync_period_steps=1,
                             concurrent_outer_step=False, heartbeat_ms=100, heartbeat_timeout_ms=1000,
                             quorum_timeout_ms=1000, rpc_timeout_ms=500, log_level="warn")
    params = [np.ones(16, dtype=np.float32)]
    learner = mend.Learner(config, [("w", params[0])], "failing-learner", token=TOKEN)
    params[0] -= np.float32(0.1)
    learner.step(8)
    lighthouse.shutdown()
    for _ in range(30):
        params[0] -= np.float32(0.1)
        learner.step(8)
    stats = learner.stats()
    learner.shutdown()
    assert stats["rounds"] == 1 and stats["failed_rounds"] == 30
    said = [line for line in capfd.readouterr().err.splitlines() if "round failed, training on" in line]
    assert len(said) == 5, said  # the 1st, 2nd, 4th, 8th and 16th of 30
    assert "(16 in a row; those between not logged)" in said[-1], said
