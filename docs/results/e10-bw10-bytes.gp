set terminal pngcairo size 900,560 noenhanced
set output 'e10-bw10-bytes.png'
set title 'E10: compressed exchanges, int8, int4 and top-k against fp32 [bw10]'
set xlabel 'data sent by worker 0 (MB)'
set ylabel 'validation loss (nats per token, average model)'
set grid
set key top right
plot 'e10-bw10-bytes.dat' index 0 with linespoints title 'diloco', 'e10-bw10-bytes.dat' index 1 with linespoints title 'gasloc-1peer-tb', 'e10-bw10-bytes.dat' index 2 with linespoints title 'gasloc-1peer-int8-modulo-tb', 'e10-bw10-bytes.dat' index 3 with linespoints title 'gasloc-1peer-int8-delta-tb', 5.9302412078695514 with lines dashtype 2 linecolor 'gray40' title 'unigram baseline (5.930)'
