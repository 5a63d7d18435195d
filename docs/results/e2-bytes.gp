set terminal pngcairo size 900,560 noenhanced
set output 'e2-bytes.png'
set title 'E2: H = 30, GASLoC against DiLoCo and Local-DAdam'
set xlabel 'data sent by worker 0 (MB)'
set ylabel 'validation loss (nats per token, average model)'
set grid
set key top right
plot 'e2-bytes.dat' index 0 with linespoints title 'diloco', 'e2-bytes.dat' index 1 with linespoints title 'gasloc-2peer', 'e2-bytes.dat' index 2 with linespoints title 'local_dadam-2peer', 'e2-bytes.dat' index 3 with linespoints title 'diloco-untuned', 5.9302412078695514 with lines dashtype 2 linecolor 'gray40' title 'unigram baseline (5.930)'
