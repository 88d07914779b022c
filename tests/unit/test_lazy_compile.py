"""compile_on_first_call: megatron-core's jit_fuser functions compile at their first call, with the same arguments."""
from gyre_hpc.train.lazy_compile import compile_on_first_call


def _recording_compiler(calls):
    def compile_fn(fn, **kwargs):
        calls.append((fn.__name__, kwargs))
        return lambda *a, **k: ("compiled", fn(*a, **k))
    return compile_fn


def scale(x, by=2):
    """Doubles."""
    return x * by


def test_nothing_is_compiled_until_the_first_call_and_then_once_with_the_given_arguments():
    calls = []
    fn = compile_on_first_call(_recording_compiler(calls), scale, dynamic=False)
    assert calls == []
    assert fn(3) == ("compiled", 6) and fn(4, by=3) == ("compiled", 12)
    assert calls == [("scale", {"dynamic": False})]


def test_the_decorator_form_with_arguments_defers_too_and_keeps_the_functions_name_and_doc():
    calls = []
    fn = compile_on_first_call(_recording_compiler(calls), fullgraph=True)(scale)
    assert calls == [] and fn.__name__ == "scale" and fn.__doc__ == "Doubles."
    assert fn(1) == ("compiled", 2) and calls == [("scale", {"fullgraph": True})]
