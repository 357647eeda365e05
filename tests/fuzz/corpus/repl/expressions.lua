1 + 2
x = {1, 2, 3}
print(#x)