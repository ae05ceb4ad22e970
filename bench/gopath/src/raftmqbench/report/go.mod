module raftmqbench/report

go 1.21
