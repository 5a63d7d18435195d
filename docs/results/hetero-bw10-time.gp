set terminal pngcairo size 900,560 noenhanced
set output 'hetero-bw10-time.png'
set title 'Heterogeneous clusters: time to a target loss on the virtual clock [bw10]'
set xlabel 'virtual time (s)'
set ylabel 'validation loss (nats per token, average model)'
set grid
set key top right
plot 'hetero-bw10-time.dat' index 0 with linespoints title 'diloco', 'hetero-bw10-time.dat' index 1 with linespoints title 'gasloc-1peer', 'hetero-bw10-time.dat' index 2 with linespoints title 'gasloc-1peer-tb', 'hetero-bw10-time.dat' index 3 with linespoints title 'gasloc-2peer', 'hetero-bw10-time.dat' index 4 with linespoints title 'gasloc-2peer-tb', 5.9302412078695514 with lines dashtype 2 linecolor 'gray40' title 'unigram baseline (5.930)'
