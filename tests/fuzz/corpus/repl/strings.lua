local s = [[
long
string]]
--[==[ comment
]==]
x = "unterminated