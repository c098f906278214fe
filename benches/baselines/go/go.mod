module activm/threadbench

go 1.22
