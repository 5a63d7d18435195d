set terminal pngcairo size 900,560 noenhanced
set output 'e1-step.png'
set title 'E1: one local step (H = 1), GASLoC against DAdam in both orders'
set xlabel 'training step (inner steps)'
set ylabel 'validation loss (nats per token, average model)'
set grid
set key top right
plot 'e1-step.dat' index 0 with linespoints title 'gasloc-1peer', 'e1-step.dat' index 1 with linespoints title 'gasloc-2peer', 'e1-step.dat' index 2 with linespoints title 'dadam-cta-1peer', 'e1-step.dat' index 3 with linespoints title 'dadam-cta-ring', 'e1-step.dat' index 4 with linespoints title 'dadam-cta-complete', 'e1-step.dat' index 5 with linespoints title 'dadam-atc-1peer', 'e1-step.dat' index 6 with linespoints title 'allreduce-adamw', 5.9302412078695514 with lines dashtype 2 linecolor 'gray40' title 'unigram baseline (5.930)'
