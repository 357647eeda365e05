-- escape: loop for ever under --safe alone (its default wall clock, shortened here)
-- env: TFHOST_SAFE_TIMEOUT=0.5
-- exit: 124
-- stderr: --timeout: the script was stopped after 0.5 s of wall-clock time, --safe's default limit
local OUT = assert(arg[1], 'the test passes the outside folder as arg[1]')
while true do end
print("ESCAPED")
