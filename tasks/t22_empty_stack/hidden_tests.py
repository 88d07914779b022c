import pytest

from containers.stack import EmptyStackError, Stack


def test_pop_empty():
    with pytest.raises(EmptyStackError):
        Stack().pop()


def test_peek_empty():
    with pytest.raises(EmptyStackError):
        Stack().peek()


def test_pop_after_draining():
    s = Stack()
    s.push(1)
    s.pop()
    with pytest.raises(EmptyStackError):
        s.pop()
