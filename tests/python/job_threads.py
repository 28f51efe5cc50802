"""What the in-process Python tests share: learners on threads of this process."""
import threading


def run_in_threads(work, count, timeout=120):
    """Runs work(i) for i in range(count), each on a thread of its own (a
    round needs them all at once); returns the exceptions they raised."""
    errors = []

    def guarded(i):
        try:
            work(i)
        except Exception as error:  # noqa: BLE001 (reported to the test)
            errors.append(error)

    threads = [threading.Thread(target=guarded, args=(i,)) for i in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=timeout)
    assert all(not thread.is_alive() for thread in threads), f"a learner's thread ran past {timeout} s"
    return errors
