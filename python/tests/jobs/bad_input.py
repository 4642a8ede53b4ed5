"""Bad input on the chief is a clear exception naming what is wrong, and loses nothing: each
check prints `ok: <what>`; the job then trains on and its counter is exact."""

import threading

import numpy as np

import cohort


def count_step(counter):
    optimizer.apply_gradients([(np.full(1, -1.0), counter)])
    return 1


def failing_step(counter):
    raise KeyError("no such feature: 'colour'")


def reads_an_unknown_variable(counter):
    phantom = cohort.Variable._handle("phantom", (1,), True)
    return phantom.read_value()


def uses_its_context_from_another_thread(counter):
    """Returns what a thread the step starts got when it read through the step's context."""
    from cohort import _steps

    context = _steps.current_context()
    seen = []

    def read():
        try:
            context.pull(counter.name)
            seen.append("read")
        except cohort.CohortError as e:
            seen.append(str(e))

    thread = threading.Thread(target=read)
    thread.start()
    thread.join()
    return seen[0]


def expect(kind, fragments, call):
    try:
        call()
    except kind as e:
        text = str(e)
        missing = [f for f in fragments if f not in text]
        if missing:
            raise AssertionError(f"{kind.__name__} does not name {missing}: {text}") from e
        return text
    raise AssertionError(f"no {kind.__name__} raised")


optimizer = cohort.optimizers.SGD(1.0)
strategy = cohort.ParameterServerStrategy(optimizer=optimizer)
coordinator = cohort.coordinator.ClusterCoordinator(strategy)
with strategy.scope():
    counter = cohort.Variable(np.zeros(1), name="counter")

before = coordinator.schedule(count_step, args=(counter,))

expect(
    cohort.StepNotImportableError,
    ["lambda"],
    lambda: coordinator.schedule(lambda c: 1, args=(counter,)),
)
print("ok: a lambda is refused at schedule")


def nested_maker():
    def nested(counter):
        return 1

    return nested


expect(
    cohort.StepNotImportableError,
    ["nested", "inside a function"],
    lambda: coordinator.schedule(nested_maker(), args=(counter,)),
)
print("ok: a nested function is refused at schedule")


def defined_late(counter):
    return 1


expect(
    cohort.StepNotImportableError,
    ["defined_late", "after its strategy was made"],
    lambda: coordinator.schedule(defined_late, args=(counter,)),
)
print("ok: a function defined after the strategy is refused at schedule")

expect(
    cohort.ArgumentsError,
    ["count_step", "argument 1", "lock"],
    lambda: coordinator.schedule(count_step, args=(counter, threading.Lock())),
)
print("ok: an argument that cannot be pickled is refused at schedule")

failed = coordinator.schedule(failing_step, args=(counter,))
expect(cohort.ClosureError, ["failing_step", "KeyError", "colour"], failed.fetch)
expect(cohort.ClosureError, ["failing_step"], coordinator.join)
print("ok: a step's exception is raised at fetch and join, naming the step")

unknown = coordinator.schedule(reads_an_unknown_variable, args=(counter,))
expect(cohort.ClosureError, ["phantom"], unknown.fetch)
expect(cohort.ClosureError, ["phantom"], coordinator.join)
print("ok: a step reading an unknown variable fails naming it")

seen = coordinator.schedule(uses_its_context_from_another_thread, args=(counter,)).fetch()
assert "belongs to its step's thread" in seen, seen
print("ok: a thread of the step using the step's context raises, naming why")


def duplicate():
    with strategy.scope():
        cohort.Variable(np.zeros(1), name="counter")


expect(cohort.VariableError, ["counter", "already exists"], duplicate)
print("ok: a second variable of the same name is refused")

expect(ValueError, ["learning rate", "-0.5"], lambda: coordinator.set_learning_rate(-0.5))
expect(ValueError, ["learning rate", "NaN"], lambda: coordinator.set_learning_rate(float("nan")))
assert coordinator.learning_rate == 1.0, coordinator.learning_rate
coordinator.join()
at_one = int(counter.numpy()[0])
coordinator.set_learning_rate(3.0)
assert coordinator.learning_rate == 3.0, coordinator.learning_rate
coordinator.schedule(count_step, args=(counter,))
coordinator.set_learning_rate(1.0)
coordinator.join()
assert int(counter.numpy()[0]) == at_one + 3, (at_one, counter.numpy())
print("ok: a rate set applies to the steps scheduled after it; a bad one is refused")

values = [coordinator.schedule(count_step, args=(counter,)) for _ in range(50)]
coordinator.join()
assert sum(v.fetch() for v in values) == 50
final = int(counter.numpy()[0])
# The first step, the one at rate 3 and the 50 after the refusals: nothing refused ran,
# nothing accepted was lost.
assert final == 54 and before.fetch() == 1, final
print(f"ok: nothing lost (counter {final} after 52 steps, one at rate 3)")
