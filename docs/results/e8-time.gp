set terminal pngcairo size 900,560 noenhanced
set output 'e8-time.png'
set title 'E8: churn on the virtual clock, elastic rounds against stop-and-resume'
set xlabel 'virtual time (s)'
set ylabel 'validation loss (nats per token, average model)'
set grid
set key top right
plot 'e8-time.dat' index 0 with linespoints title 'diloco', 'e8-time.dat' index 1 with linespoints title 'diloco-restart', 'e8-time.dat' index 2 with linespoints title 'diloco-elastic', 'e8-time.dat' index 3 with linespoints title 'gasloc-1peer-elastic', 'e8-time.dat' index 4 with linespoints title 'gasloc-2peer-elastic', 5.9302412078695514 with lines dashtype 2 linecolor 'gray40' title 'unigram baseline (5.930)'
