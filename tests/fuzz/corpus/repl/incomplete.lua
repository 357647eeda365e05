if true then
