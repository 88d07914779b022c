"""A small LIFO stack with a documented error type."""


class EmptyStackError(Exception):
    """Raised by pop() and peek() on an empty stack."""


class Stack:
    def __init__(self):
        self._items = []

    def push(self, item):
        self._items.append(item)

    def pop(self):
        return self._items.pop()

    def peek(self):
        return self._items[-1]

    def __len__(self):
        return len(self._items)
