def fib(n):
    return n" 333?fff? ((2:

:return*8