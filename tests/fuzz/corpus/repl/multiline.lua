for i = 1, 3 do
  print(i)
end
function f(a,
b)
return a + b end