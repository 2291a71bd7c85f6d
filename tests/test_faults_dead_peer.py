"""What a survivor sees when its peer dies in a gloo collective (``mpkit.runtime.faults.dead_peer``):
a peer whose process ends closes its connection, and the collective fails at once with "Connection
closed by peer"; a peer that lives but never joins is noticed only when the process group's
timeout runs out ("Timed out"). Behaviour is checked by the errors; the one time relation asserted
is a lower bound (gloo cannot time out before its timeout, however loaded the machine)."""
import pytest

from mpkit.runtime.faults import dead_peer


@pytest.mark.timeout(90)
def test_a_dead_peer_fails_the_collective_at_once_and_a_hung_one_after_the_timeout(no_leftovers):
    exited = dead_peer("exit", timeout=1.0)
    assert "closed by peer" in exited.error or "reset by peer" in exited.error, exited.error
    hung = dead_peer("hang", timeout=1.0)
    assert "Timed out waiting 1000ms" in hung.error, hung.error
    assert hung.seconds >= 0.9 * hung.timeout  # gloo's own clock, not the test's


def test_bad_input_says_what_to_pass():
    with pytest.raises(ValueError, match="'exit'"):
        dead_peer("crash")
    with pytest.raises(ValueError, match="0.1 to 60"):
        dead_peer("exit", timeout=0)
